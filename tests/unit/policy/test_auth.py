"""Authentication: the pure gate, and every route and transport of the app behind it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from wsproto.events import AcceptConnection, RejectConnection

from reactor_fabric.config.hosts import https_or_loopback
from reactor_fabric.config.hosts import is_loopback_name as is_loopback
from reactor_fabric.policy.auth import (
    Gate,
    Refusal,
    admit,
    presented_token,
    token_matches,
)
from reactor_fabric.policy.principal import TOKEN_HOLDER
from tests.messages import INITIALIZE
from tests.served import served

TOKEN = "s3cret-token-0123456789abcdef"
GATE = Gate(frozenset(), frozenset({"127.0.0.1", "localhost", "::1"}), TOKEN)
HOST = {b"host": "127.0.0.1:8765"}


@pytest.mark.parametrize(
    ("headers", "query", "expected"),
    [
        ({b"authorization": f"Bearer {TOKEN}"}, "", TOKEN),
        ({b"authorization": f"bearer   {TOKEN} "}, "", TOKEN),  # scheme is case-insensitive
        ({}, f"token={TOKEN}", TOKEN),
        ({}, f"mount=/a:/workspace&token={TOKEN}", TOKEN),
        ({b"authorization": f"Bearer {TOKEN}"}, "token=other", TOKEN),  # the header wins
        ({b"authorization": f"Basic {TOKEN}"}, "", None),
        ({}, "mount=/a:/workspace", None),
        ({}, "", None),
    ],
)
def test_the_token_is_taken_from_the_bearer_header_else_the_query(
    headers: dict[bytes, str], query: str, expected: str | None
) -> None:
    assert presented_token(headers, query) == expected


def test_tokens_match_only_exactly() -> None:
    assert token_matches(TOKEN, TOKEN)
    for wrong in (None, "", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), "é" * 20):
        assert not token_matches(wrong, TOKEN)


def test_a_missing_token_and_a_wrong_one_are_refused_with_401_and_a_bearer_challenge() -> None:
    for headers, query, reason in [
        (HOST, "", "token_missing"),
        ({**HOST, b"authorization": "Bearer nope"}, "", "token_invalid"),
        (HOST, "token=nope", "token_invalid"),
    ]:
        refusal = admit(GATE, headers, query, "/mcp/time")
        assert isinstance(refusal, Refusal)
        assert (refusal.status, refusal.reason) == (401, reason)
        challenge = dict(refusal.headers)[b"www-authenticate"]
        assert challenge.startswith(b'Bearer realm="reactor-fabric"')
        assert (b'error="invalid_token"' in challenge) == (reason == "token_invalid")
        # The one text some clients show of a 401: where the token comes from.
        description = re.search(rb'error_description="([ !#-\[\]-~]*)"', challenge)
        assert description is not None, challenge
        assert b"reactor-fabric/token" in description.group(1)
        assert b"REACTOR_FABRIC_TOKEN" in description.group(1)
        error = json.loads(refusal.body)["error"]  # a JSON-RPC error, which SDKs surface
        assert error["code"] == -32004
        assert error["data"]["reason"] == reason
        assert "reactor-fabric/token" in error["data"]["detail"]  # says where the token is
        assert "nope" not in refusal.body.decode()


def test_origin_and_host_are_judged_before_the_token() -> None:
    """A page must not learn whether it guessed the token."""
    for headers in (
        {**HOST, b"origin": "https://evil.example", b"authorization": f"Bearer {TOKEN}"},
        {b"host": "evil.example:8765", b"authorization": "Bearer nope"},
    ):
        refusal = admit(GATE, headers, "", "/mcp/time")
        assert isinstance(refusal, Refusal)
        assert refusal.status == 403


def test_the_right_token_and_no_auth_at_all_let_a_request_through() -> None:
    bearer = {**HOST, b"authorization": f"Bearer {TOKEN}"}
    assert admit(GATE, bearer, "", "/mcp/x") is TOKEN_HOLDER
    assert admit(GATE, HOST, f"token={TOKEN}", "/mcp/x") is TOKEN_HOLDER
    open_gate = Gate(GATE.allowed_origins, GATE.allowed_hosts, None)
    assert admit(open_gate, HOST, "", "/mcp/x") is TOKEN_HOLDER


def test_a_query_with_too_many_fields_is_a_missing_token_not_a_crash() -> None:
    refusal = admit(GATE, HOST, "&".join(["a=1"] * 100) + "&token=x", "/mcp/x")
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "token_missing"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.4", False),
        ("example.org", False),
    ],
)
def test_only_loopback_addresses_count_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# --- the app: every route and transport -------------------------------------------------------


WRONG_BEARER = {"authorization": "Bearer wrong"}


async def test_every_http_route_refuses_a_request_without_the_token(tmp_path: Path) -> None:
    # The catalog is learned, so that a request let through on the fabric endpoint would be
    # served at once (and show here) rather than wait for it.
    async with served(tmp_path, token=TOKEN, learn_catalog=True) as http:
        for method, target, headers in [
            ("POST", "/mcp/svc", {}),
            ("GET", "/mcp/svc", {}),
            ("DELETE", "/mcp/svc", {}),
            ("GET", "/mcp/svc", WRONG_BEARER),
            ("DELETE", "/mcp/svc", {**WRONG_BEARER, "mcp-session-id": "0" * 32}),
            ("POST", "/mcp/svc/some-key-123", {}),
            ("POST", "/mcp/svc?token=wrong", {}),
            ("POST", "/mcp", {}),
            ("POST", "/mcp", WRONG_BEARER),
            ("POST", "/mcp?tools=all&token=wrong", {}),
            ("GET", "/mcp", {}),
            ("GET", "/mcp", WRONG_BEARER),
            ("DELETE", "/mcp", {"mcp-session-id": "0" * 32}),
            ("DELETE", "/mcp", WRONG_BEARER),
            ("POST", "/mcp/fabric/some-key-123", {}),
            ("POST", "/mcp/fabric/some-key-123", WRONG_BEARER),
            ("GET", "/mcp/fabric/some-key-123", {}),
            ("DELETE", "/mcp/fabric/some-key-123?token=wrong", {}),
            ("GET", "/elsewhere", {}),
        ]:
            body = INITIALIZE if method == "POST" else None
            reply = await http.http(method, target, body, headers=headers)
            assert reply.status == 401, (method, target, headers)
            assert reply.headers["www-authenticate"].startswith("Bearer")
            assert reply.json()["error"]["data"]["reason"] in ("token_missing", "token_invalid")
        assert http.runtime.alive == []
        assert http.fabric.registry.sessions == {}


async def test_a_websocket_without_the_token_is_refused_at_the_handshake(tmp_path: Path) -> None:
    async with served(tmp_path, token=TOKEN) as http:
        for target, headers in [
            ("/mcp/svc", []),
            ("/mcp/svc?token=wrong", []),
            ("/mcp/svc", [(b"authorization", b"Bearer wrong")]),
            ("/mcp", []),
            ("/mcp?tools=all&token=wrong", []),
            ("/mcp", [(b"authorization", b"Bearer wrong")]),
        ]:
            ws, answer = await http.websocket(target, headers=headers)
            await ws.aclose()
            assert isinstance(answer, RejectConnection), target
            assert answer.status_code == 401
            assert dict(answer.headers)[b"www-authenticate"].startswith(b"Bearer")
            reason = json.loads(ws.rejected_body)["error"]["data"]["reason"]
            assert reason in ("token_missing", "token_invalid")
        assert http.fabric.registry.sessions == {}


async def test_a_refused_websocket_upgrade_has_a_reason_phrase_in_its_status_line(
    tmp_path: Path,
) -> None:
    # wsproto writes "HTTP/1.1 401 " (no phrase); clients print the status line they got.
    async with served(tmp_path, token=TOKEN) as http:
        stream = http.connect()
        await stream.send_all(
            b"GET /mcp/svc HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        answer = b""
        while b"\r\n" not in answer:
            answer += await stream.receive_some(65536)
        await stream.aclose()
        assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 401 Unauthorized"


async def test_the_token_by_header_or_in_the_url_opens_a_session(tmp_path: Path) -> None:
    async with served(tmp_path, token=TOKEN) as http:
        bearer = {"authorization": f"Bearer {TOKEN}"}
        by_header = await http.post(INITIALIZE, headers=bearer)
        in_url = await http.post(INITIALIZE, path=f"/mcp/svc?token={TOKEN}")
        for reply in (by_header, in_url):
            assert reply.status == 200
            assert reply.json()["id"] == 1
            ended = await http.http(
                "DELETE", "/mcp/svc", headers={**bearer, "mcp-session-id": reply.session}
            )
            assert ended.status == 204
        for target, headers in [
            (f"/mcp/svc?token={TOKEN}", []),
            ("/mcp/svc", [(b"authorization", f"Bearer {TOKEN}".encode())]),
        ]:
            ws, answer = await http.websocket(target, headers=headers)
            assert isinstance(answer, AcceptConnection)
            await ws.send_json(INITIALIZE)
            assert (await ws.hear())["id"] == 1
            await ws.aclose()


async def test_healthz_without_the_token_says_only_whether_it_is_up(tmp_path: Path) -> None:
    async with served(tmp_path, token=TOKEN) as http:
        for headers in ({}, {"authorization": "Bearer wrong"}):
            reply = await http.http("GET", "/healthz", headers=headers)
            assert (reply.status, reply.json()) == (200, {"status": "ok"})
        full = await http.http("GET", "/healthz", headers={"authorization": f"Bearer {TOKEN}"})
        assert full.status == 200
        assert {"status", "docker", "sessions", "containers", "version"} <= set(full.json())
        # HEAD tells no more: its length is the status-only answer's, not the full one's.
        for headers in ({}, {"authorization": "Bearer wrong"}):
            head = await http.http("HEAD", "/healthz", headers=headers)
            assert (head.status, head.body) == (200, b"")
            assert head.headers["content-length"] == str(len(b'{"status": "ok"}'))
        bearer = {"authorization": f"Bearer {TOKEN}"}
        head = await http.http("HEAD", "/healthz", headers=bearer)
        assert head.headers["content-length"] == full.headers["content-length"]
        # The Origin and Host checks hold for healthz too.
        for method in ("GET", "HEAD"):
            forged = await http.http(method, "/healthz", headers={"origin": "https://evil.example"})
            assert forged.status == 403


@pytest.mark.parametrize(
    ("url", "trusted"),
    [
        ("https://login.example.com/realms/a", True),
        ("http://127.0.0.1:3000", True),
        ("http://[::1]:3000/x", True),
        ("http://localhost/keys", True),
        ("http://login.example.com", False),
        ("https://", False),
        ("ftp://127.0.0.1/", False),
        ("file:///etc/keys", False),
        (None, False),
    ],
)
def test_only_https_urls_and_http_on_loopback_are_trusted(url: object, trusted: bool) -> None:
    assert https_or_loopback(url) is trusted
