// Drive the official MCP TypeScript SDK 1.x client from a test, one command per line (the same
// protocol as mcp1_client.py), over WebSocketClientTransport or StreamableHTTPClientTransport.
//
// Usage: node --experimental-websocket ts_client.mjs ws|http URL [--register MOUNTS_JSON]
//
// With --register, a transport wrapper sends fabric/registerClient as the connection's first
// message and consumes its answer before the SDK's Client starts its own handshake — the way a
// fabric-aware client built on the SDK registers its project directory.
//
// Commands (stdin, JSON lines): {"op":"initialize"} {"op":"list_tools"} (its answer: the tools'
//   names, and "described": [name, description] of each)
//   {"op":"call","name":N,"arguments":A,"progress":false,"report_progress":false} {"op":"exit"}
//   (with report_progress, each progress notification is printed as it comes: {"op":"progress"})
import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { WebSocketClientTransport } from "@modelcontextprotocol/sdk/client/websocket.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const emit = (payload) => process.stdout.write(JSON.stringify(payload) + "\n");

class RegisteringTransport {
  constructor(inner, mounts) {
    this.inner = inner;
    this.mounts = mounts;
  }
  // Opens the connection and registers; the SDK's Client calls start() later, which only wires
  // the handlers, so its own handshake follows the registration on the same connection.
  async register() {
    await this.inner.start();
    const answer = await new Promise((resolve, reject) => {
      this.inner.onmessage = resolve;
      this.inner.onerror = reject;
      this.inner.onclose = () => reject(new Error("closed during registration"));
      this.inner.send({
        jsonrpc: "2.0", id: "register", method: "fabric/registerClient",
        params: { mounts: this.mounts },
      });
    });
    emit({ op: "register", ok: !("error" in answer), result: answer.result, error: answer.error });
    return !("error" in answer);
  }
  async start() {
    this.inner.onmessage = (message, extra) => this.onmessage?.(message, extra);
    this.inner.onerror = (error) => this.onerror?.(error);
    this.inner.onclose = () => this.onclose?.();
  }
  send(message, options) { return this.inner.send(message, options); }
  close() { return this.inner.close(); }
}

const args = process.argv.slice(2);
const kind = args[0];
const url = new URL(args[1]);
const registerAt = args.indexOf("--register");
// The orchestrator's token, as a user gives it: a header over HTTP, in the URL over WebSocket
// (the SDK's WebSocket transport takes no headers).
const token = process.env.REACTOR_FABRIC_TOKEN;
if (token && kind !== "http") url.searchParams.set("token", token);
const requestInit = token ? { headers: { Authorization: `Bearer ${token}` } } : undefined;
let transport =
  kind === "http" ? new StreamableHTTPClientTransport(url, { requestInit }) : new WebSocketClientTransport(url);
if (registerAt !== -1) {
  transport = new RegisteringTransport(transport, JSON.parse(args[registerAt + 1]));
  if (!(await transport.register())) process.exit(0);
}
const client = new Client({ name: "reactor-fabric-ts-test", version: "1.0.0" });

const errorOf = (error) => ({ code: error.code, message: error.message, data: error.data });

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  const command = JSON.parse(line);
  try {
    if (command.op === "exit") break;
    if (command.op === "initialize") {
      await client.connect(transport);
      const info = client.getServerVersion();
      emit({ ok: true, server: info?.name, protocol: transport.inner?.protocolVersion });
    } else if (command.op === "list_tools") {
      const result = await client.listTools();
      // described: each tool the SDK handed over, in order, with the description a model reads.
      emit({ ok: true, tools: result.tools.map((tool) => tool.name),
             described: result.tools.map((tool) => [tool.name, tool.description ?? null]) });
    } else if (command.op === "call") {
      const progress = [];
      const onprogress = (p) => {
        progress.push([p.progress, p.total ?? null]);
        if (command.report_progress) emit({ op: "progress", progress: p.progress });
      };
      const options = command.progress || command.report_progress ? { onprogress } : undefined;
      const result = await client.callTool(
        { name: command.name, arguments: command.arguments ?? {} }, undefined, options);
      emit({ ok: !result.isError, content: result.content, structured: result.structuredContent ?? null,
             progress });
    } else {
      emit({ ok: false, error: { message: `unknown op ${command.op}` } });
    }
  } catch (error) {
    emit({ ok: false, error: errorOf(error) });
    if (command.op === "initialize") break;
  }
}
// A well-behaved Streamable HTTP client ends its session (DELETE) instead of letting it expire.
const inner = transport.inner ?? transport;
if (typeof inner.terminateSession === "function") await inner.terminateSession().catch(() => {});
await client.close().catch(() => {});
process.exit(0);
