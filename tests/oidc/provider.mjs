// An OpenID provider for tests (oidc-provider 9.x): the authorization server that the
// orchestrator, as an OAuth 2.1 resource server, trusts in the MCP authorization tests.
//
//   node provider.mjs CONFIG.json [PORT]
//
// CONFIG.json is written by tests/oidc_provider.py:
//   {"jwks": {"keys": [private RSA JWK]}, "accounts": {"alice": {"groups": [...], "email": ...}},
//    "clients": [client metadata], "access_token_ttl": 300}
// PORT (or $OIDC_PROVIDER_PORT) 0 or absent takes any free port. It listens on 127.0.0.1 only
// and, once listening, prints one JSON line on stdout: {"issuer": "http://127.0.0.1:P", "port": P}.
// Everything else it says (oidc-provider's warnings, errors) goes to stderr.
//
// What it grants:
// - authorization code with PKCE (S256, required for every client), refresh tokens, the device
//   flow; open dynamic client registration (no initial access token), as MCP clients register;
// - with a `resource` that is a loopback http(s) URL (any port, any path): a JWT access token
//   (RS256, the configured key) whose `aud` is that resource, `sub` the login name, `groups`
//   the account's groups, `scope` the resource's granted scopes (`mcp`). A resource elsewhere
//   is refused (invalid_target). Without `resource`, tokens are opaque (userinfo's).
// - logins: a form (`login`, `password` ignored) that accepts only the configured accounts;
//   an unknown login is answered 401 with the form again. Consent is a form to post.
//   Both are served here (/interaction/UID...), not by devInteractions, which accept any login.
import { readFileSync } from 'node:fs';
import * as crypto from 'node:crypto';
import * as http from 'node:http';

import Provider, { errors } from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const requestedPort = Number(process.argv[3] ?? process.env.OIDC_PROVIDER_PORT ?? 0);
const accounts = config.accounts ?? {};
const accessTokenTTL = Number(config.access_token_ttl ?? 300);
const RESOURCE_SCOPE = 'mcp';
const LOOPBACK_HOSTS = new Set(['localhost', '[::1]']);

function escapeHtml(value) {
  return String(value)
    .replaceAll('&', '&amp;')
    .replaceAll('<', '&lt;')
    .replaceAll('>', '&gt;')
    .replaceAll('"', '&quot;')
    .replaceAll("'", '&#39;');
}

function page(title, body) {
  return `<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>${escapeHtml(title)}</title></head>
<body><h1>${escapeHtml(title)}</h1>
${body}
</body></html>`;
}

function isLoopbackResource(indicator) {
  const url = URL.parse(indicator);
  if (!url || !['http:', 'https:'].includes(url.protocol)) return false;
  return LOOPBACK_HOSTS.has(url.hostname) || /^127\.\d+\.\d+\.\d+$/.test(url.hostname);
}

function findAccountByLogin(login) {
  return Object.hasOwn(accounts, login) ? accounts[login] : undefined;
}

async function findAccount(_ctx, sub) {
  const account = findAccountByLogin(sub);
  // undefined: oidc-provider then treats the session's account as gone (and asks to log in).
  if (!account) return undefined;
  return {
    accountId: sub,
    async claims() {
      return { sub, email: account.email, groups: account.groups ?? [] };
    },
  };
}

function readForm(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      // A login form is a few hundred bytes: anything much larger is not one.
      if (size > 64 * 1024) {
        reject(new Error('form too large'));
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => resolve(new URLSearchParams(Buffer.concat(chunks).toString('utf8'))));
    req.on('error', reject);
  });
}

function send(res, status, title, body) {
  res.statusCode = status;
  res.setHeader('Content-Type', 'text/html; charset=utf-8');
  res.setHeader('Cache-Control', 'no-store');
  res.end(page(title, body));
}

function loginForm(uid, error) {
  const message = error ? `<p id="error">${escapeHtml(error)}</p>\n` : '';
  return `${message}<form id="login" method="post" action="/interaction/${escapeHtml(uid)}/login">
<input type="text" name="login" autofocus>
<input type="password" name="password">
<button type="submit">Sign in</button>
</form>`;
}

function consentForm(uid, details) {
  return `<pre id="details">${escapeHtml(JSON.stringify(details))}</pre>
<form id="consent" method="post" action="/interaction/${escapeHtml(uid)}/confirm">
<button type="submit">Allow</button>
</form>
<a id="abort" href="/interaction/${escapeHtml(uid)}/abort">Deny</a>`;
}

// The login and consent pages (what devInteractions would serve, with real account checks).
// An unknown or expired interaction (no `_interaction` cookie) is oidc-provider's
// SessionNotFound: answered 400 with its description.
async function interaction(provider, req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) {
    send(res, 400, 'Error', '<p id="error">interaction mismatch</p>');
    return;
  }
  const { prompt, params, session, grantId } = details;
  if (req.method === 'GET' && action === undefined) {
    if (prompt.name === 'login') send(res, 200, 'Sign-in', loginForm(uid));
    else send(res, 200, 'Authorize', consentForm(uid, prompt.details));
    return;
  }
  if (req.method === 'GET' && action === 'abort') {
    await provider.interactionFinished(
      req,
      res,
      { error: 'access_denied', error_description: 'End-User aborted interaction' },
      { mergeWithLastSubmission: false },
    );
    return;
  }
  if (req.method === 'POST' && action === 'login' && prompt.name === 'login') {
    const login = (await readForm(req)).get('login') ?? '';
    if (!findAccountByLogin(login)) {
      send(res, 401, 'Sign-in', loginForm(uid, `unknown user ${login}`));
      return;
    }
    await provider.interactionFinished(
      req,
      res,
      { login: { accountId: login } },
      { mergeWithLastSubmission: false },
    );
    return;
  }
  if (req.method === 'POST' && action === 'confirm' && prompt.name === 'consent') {
    await readForm(req);
    // As devInteractions' consent: grant whatever the prompt found missing.
    const grant = grantId
      ? await provider.Grant.find(grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    const missing = prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    const savedGrantId = await grant.save();
    await provider.interactionFinished(
      req,
      res,
      { consent: { grantId: savedGrantId } },
      { mergeWithLastSubmission: true },
    );
    return;
  }
  send(res, 400, 'Error', `<p id="error">no ${escapeHtml(action ?? 'page')} for prompt ${escapeHtml(prompt.name)}</p>`);
}

function configuration() {
  return {
    jwks: config.jwks,
    clients: config.clients ?? [],
    findAccount,
    // Every scope a client may register (oidc-provider refuses a registered `scope` naming one it
    // does not know: the MCP SDK registers with the scope it is about to ask for, e.g. `mcp`).
    scopes: ['openid', 'offline_access', RESOURCE_SCOPE],
    claims: { openid: ['sub'], email: ['email'], groups: ['groups'] },
    // OAuth 2.1: the code flow only (no implicit or hybrid response types).
    responseTypes: ['code'],
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: false },
      registration: { enabled: true },
      revocation: { enabled: true },
      deviceFlow: {
        enabled: true,
        async userCodeInputSource(ctx, form, _out, err) {
          const message = err ? `<p id="error">${escapeHtml(err.message ?? String(err))}</p>\n` : '';
          ctx.type = 'html';
          ctx.body = page('Device sign-in', `${message}${form}
<button type="submit" form="op.deviceInputForm">Continue</button>`);
        },
        async userCodeConfirmSource(ctx, form, _client, _deviceInfo, userCode) {
          ctx.type = 'html';
          ctx.body = page('Confirm device', `<p>Code <code id="user-code">${escapeHtml(userCode)}</code></p>
${form}
<button type="submit" form="op.deviceConfirmForm">Continue</button>`);
        },
        async successSource(ctx) {
          ctx.type = 'html';
          ctx.body = page('Sign-in success', '<p id="device-approved">The device is signed in.</p>');
        },
      },
      resourceIndicators: {
        enabled: true,
        defaultResource: (_ctx, _client, oneOf) => oneOf,
        // A token request without `resource` still gets the one the authorization named.
        useGrantedResource: () => true,
        async getResourceServerInfo(_ctx, indicator) {
          if (!isLoopbackResource(indicator)) {
            throw new errors.InvalidTarget(`resource ${indicator} is not a loopback URL`);
          }
          return {
            scope: RESOURCE_SCOPE,
            audience: indicator,
            accessTokenTTL,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
    async extraTokenClaims(_ctx, token) {
      const account = token.accountId ? findAccountByLogin(token.accountId) : undefined;
      if (!account) return undefined;
      return account.email
        ? { groups: account.groups ?? [], email: account.email }
        : { groups: account.groups ?? [] };
    },
    // Refresh tokens for every client allowed the grant, offline_access asked for or not.
    issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token'),
    // No browser is involved: any origin may call the token endpoint.
    clientBasedCORS: () => true,
    renderError(ctx, out) {
      ctx.type = 'json';
      ctx.body = out;
    },
    cookies: { keys: [crypto.randomBytes(32).toString('base64url')] },
    ttl: {
      AccessToken: accessTokenTTL,
      AuthorizationCode: 60,
      ClientCredentials: accessTokenTTL,
      DeviceCode: 600,
      Grant: 3600,
      IdToken: 3600,
      Interaction: 600,
      RefreshToken: 24 * 3600,
      Session: 3600,
    },
  };
}

let provider;
let providerCallback;
const INTERACTION = /^\/interaction\/([^/]+)(?:\/(login|confirm|abort))?$/;

const server = http.createServer((req, res) => {
  const path = new URL(req.url, 'http://127.0.0.1').pathname;
  const match = INTERACTION.exec(path);
  if (!match) {
    providerCallback(req, res);
    return;
  }
  interaction(provider, req, res, match[1], match[2]).catch((err) => {
    if (!res.headersSent) {
      const status = err.statusCode ?? 500;
      send(res, status, 'Error', `<p id="error">${escapeHtml(err.error_description ?? err.message)}</p>`);
    } else {
      res.end();
    }
    if ((err.statusCode ?? 500) >= 500) console.error(err);
  });
});

server.listen(requestedPort, '127.0.0.1', () => {
  const { port } = server.address();
  const issuer = `http://127.0.0.1:${port}`;
  provider = new Provider(issuer, configuration());
  provider.on('server_error', (_ctx, err) => console.error('server_error', err));
  providerCallback = provider.callback();
  process.stdout.write(`${JSON.stringify({ issuer, port })}\n`);
});

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => {
    server.close();
    server.closeAllConnections();
    process.exit(0);
  });
}
