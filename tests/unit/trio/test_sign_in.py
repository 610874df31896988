"""Users signing in (``auth.mode: oidc``) on the app, every route and transport: the protected
resource metadata, the 401 that names it, a user's access token opening a session that is
theirs alone — another user's session id and keyed URL lead nowhere — and the issuer's key
rotation and outage. Over memory streams, with a fake issuer whose tokens are really signed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest
from wsproto.events import AcceptConnection, RejectConnection

from reactor_fabric.config.structs import Auth, Orchestrator, Service, UserEntry
from reactor_fabric.policy.sign_in import sign_in_for
from tests.issuer import ISSUER, FakeIssuer
from tests.messages import INITIALIZE
from tests.served import Served, served

PUBLIC = "https://fabric.example.com"
METADATA_URL = f"{PUBLIC}/.well-known/oauth-protected-resource"


def orchestrator(root: Path, **auth: object) -> Orchestrator:
    return Orchestrator(
        allowed_mount_roots=[str(root)],
        public_url=PUBLIC,
        auth=Auth(mode="oidc", issuer=ISSUER, **auth),  # type: ignore[arg-type]
    )


@asynccontextmanager
async def signing_in(
    root: Path,
    issuer: FakeIssuer,
    *,
    services: dict[str, Service] | None = None,
    users: dict[str, UserEntry] | None = None,
    **auth: object,
) -> AsyncIterator[Served]:
    """The app of an orchestrator whose users sign in with ``issuer`` (``auth``: more of its
    fields), serving ``services`` (default: one) under the policy of ``users``."""
    sign_in = sign_in_for(orchestrator(root, **auth), "127.0.0.1", 8765)
    async with served(
        root,
        sign_in=sign_in,
        issuer_fetcher=issuer,
        public_url=PUBLIC,
        learn_catalog=True,
        services=services,
        users=users or {},
    ) as http:
        yield http


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def issuer() -> FakeIssuer:
    return FakeIssuer()


async def test_the_protected_resource_metadata_names_the_issuer_at_every_path_form(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    async with signing_in(tmp_path, issuer) as http:
        for path in ("", "/mcp", "/mcp/svc", "/mcp/fabric/some-key", "/mcp/svc/key-1"):
            reply = await http.http("GET", f"/.well-known/oauth-protected-resource{path}")
            assert reply.status == 200, path
            assert reply.json() == {
                "resource": PUBLIC,
                "authorization_servers": [ISSUER],
                "bearer_methods_supported": ["header"],
                "resource_name": "Reactor-Fabric",
            }
        for path in ("/elsewhere", "/mcp/a/b/c", "x"):
            missing = await http.http("GET", f"/.well-known/oauth-protected-resource{path}")
            assert missing.status == 404, path
        posted = await http.http("POST", "/.well-known/oauth-protected-resource", b"{}")
        assert posted.status == 405
        forged = await http.http(
            "GET",
            "/.well-known/oauth-protected-resource",
            headers={"origin": "https://evil.example"},
        )
        assert forged.status == 403
        assert issuer.fetched == []  # nothing about the issuer needed for that


async def test_a_request_without_an_access_token_is_told_where_to_sign_in(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    token = issuer.token("alice", PUBLIC)
    async with signing_in(tmp_path, issuer) as http:
        for method, target, headers in [
            ("POST", "/mcp", {}),
            ("POST", "/mcp/svc", {}),
            ("GET", "/mcp/svc", {}),
            ("POST", "/mcp/fabric/key-1", {}),
            # A token in the URL is not looked at in this mode.
            ("POST", f"/mcp/svc?token={token}", {}),
            ("POST", "/mcp/svc", {"authorization": f"Basic {token}"}),
            ("GET", "/api/sessions", {}),
        ]:
            body = INITIALIZE if method == "POST" else None
            reply = await http.http(method, target, body, headers=headers)
            assert reply.status == 401, target
            assert reply.headers["www-authenticate"] == f'Bearer resource_metadata="{METADATA_URL}"'
            error = reply.json()["error"]
            assert (error["code"], error["data"]["reason"]) == (-32004, "token_missing")
            assert "sign in" in error["message"]
        ws, answer = await http.websocket("/mcp/svc")
        await ws.aclose()
        assert isinstance(answer, RejectConnection)
        assert answer.status_code == 401
        assert (
            dict(answer.headers)[b"www-authenticate"]
            .decode()
            .startswith(f'Bearer resource_metadata="{METADATA_URL}"')
        )
        assert http.fabric.registry.sessions == {}


async def test_a_users_token_opens_a_session_that_names_the_user(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    async with signing_in(tmp_path, issuer) as http:
        reply = await http.post(INITIALIZE, headers=bearer(issuer.token("alice", PUBLIC)))
        assert reply.status == 200
        assert reply.json()["id"] == 1
        session = http.sessions.by_id[reply.session]
        assert session.owner == "alice"
        assert session.client is not None
        record = session.client.record()
        assert (record["user"], record["groups"], record["token"]) == (
            "alice",
            ["team-alice"],
            "oidc",
        )
        ws, answer = await http.websocket(
            "/mcp/svc",
            headers=[(b"authorization", f"Bearer {issuer.token('bob', PUBLIC)}".encode())],
        )
        assert isinstance(answer, AcceptConnection)
        await ws.send_json(INITIALIZE)
        assert (await ws.hear())["id"] == 1
        await ws.aclose()
        await http.http(
            "DELETE",
            "/mcp/svc",
            headers={**bearer(issuer.token("alice", PUBLIC)), "mcp-session-id": reply.session},
        )


async def test_another_users_session_id_is_an_unknown_session(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    alice, bob = issuer.token("alice", PUBLIC), issuer.token("bob", PUBLIC)
    async with signing_in(tmp_path, issuer) as http:
        opened = await http.post(INITIALIZE, headers=bearer(alice))
        sid = {"mcp-session-id": opened.session}
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        stolen = await http.post(ping, headers={**bearer(bob), **sid})
        assert stolen.status == 404
        listen = await http.http(
            "GET", "/mcp/svc", headers={**bearer(bob), **sid}, accept="text/event-stream"
        )
        assert listen.status == 404
        ended = await http.http("DELETE", "/mcp/svc", headers={**bearer(bob), **sid})
        assert ended.status == 404
        # Alice's session is untouched, and hers to use.
        own = await http.post(ping, headers={**bearer(alice), **sid})
        assert (own.status, own.json()["id"]) == (200, 2)
        done = await http.http("DELETE", "/mcp/svc", headers={**bearer(alice), **sid})
        assert done.status == 204


async def test_one_users_keyed_url_never_reaches_another_users_session(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    alice, bob = issuer.token("alice", PUBLIC), issuer.token("bob", PUBLIC)
    async with signing_in(tmp_path, issuer) as http:
        for path in ("/mcp/svc/shared-key-1", "/mcp/fabric/shared-key-1"):
            hers = await http.post(INITIALIZE, path=path, headers=bearer(alice))
            his = await http.post(INITIALIZE, path=path, headers=bearer(bob))
            assert hers.status == his.status == 200
            assert hers.session != his.session
            assert http.sessions.by_id[hers.session].owner == "alice"
            assert http.sessions.by_id[his.session].owner == "bob"
            for token, sid in ((alice, hers.session), (bob, his.session)):
                await http.http("DELETE", path, headers={**bearer(token), "mcp-session-id": sid})


async def test_refused_tokens_get_their_reason_and_an_invalid_token_challenge(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    stranger = FakeIssuer("https://evil.example.com")
    async with signing_in(tmp_path, issuer, scopes=["mcp"]) as http:
        for token, status, reason in [
            (issuer.token("alice", PUBLIC, lifetime=-120), 401, "token_expired"),
            (issuer.token("alice", "https://other.example.com"), 401, "token_invalid"),
            (stranger.token("alice", PUBLIC), 401, "token_invalid"),
            (issuer.token("alice", PUBLIC, scope="email"), 403, "token_insufficient_scope"),
            ("not.a.jwt", 401, "token_invalid"),
        ]:
            reply = await http.post(INITIALIZE, headers=bearer(token))
            assert (reply.status, reply.json()["error"]["data"]["reason"]) == (status, reason)
            challenge = reply.headers["www-authenticate"]
            code = "insufficient_scope" if status == 403 else "invalid_token"
            assert challenge.startswith(
                f'Bearer resource_metadata="{METADATA_URL}", scope="mcp", error="{code}"'
            )
            assert token not in reply.body.decode()
        assert http.fabric.registry.sessions == {}


async def test_a_rotated_key_is_fetched_when_a_token_names_it(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    async with signing_in(tmp_path, issuer) as http:
        first = await http.post(INITIALIZE, headers=bearer(issuer.token("alice", PUBLIC)))
        assert first.status == 200
        fetched = len(issuer.fetched)
        http.fabric.authenticator.keys.min_interval = 0.0  # type: ignore[union-attr]
        issuer.rotate()
        second = await http.post(INITIALIZE, headers=bearer(issuer.token("alice", PUBLIC)))
        assert second.status == 200
        assert len(issuer.fetched) == fetched + 2
        for reply in (first, second):
            await http.http(
                "DELETE",
                "/mcp/svc",
                headers={**bearer(issuer.token("alice", PUBLIC)), "mcp-session-id": reply.session},
            )


async def test_an_issuer_that_cannot_be_reached_is_a_503_not_a_401(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    issuer.failing = True
    async with signing_in(tmp_path, issuer) as http:
        reply = await http.post(INITIALIZE, headers=bearer(issuer.token("alice", PUBLIC)))
        assert reply.status == 503
        error = reply.json()["error"]
        assert error["data"]["reason"] == "issuer_unavailable"
        assert "502" in error["data"]["detail"]
        assert "www-authenticate" not in reply.headers  # nothing for a client to sign in again
        assert http.fabric.registry.sessions == {}


async def test_the_sign_in_of_a_suite_on_loopback_accepts_each_loopback_url(
    tmp_path: Path,
) -> None:
    suite_orchestrator = msgspec.structs.replace(orchestrator(tmp_path), public_url=None)
    sign_in = sign_in_for(suite_orchestrator, "127.0.0.1", 8765)
    assert sign_in is not None
    resources = sign_in.resource.resources
    assert resources == ("http://127.0.0.1:8765", "http://localhost:8765", "http://[::1]:8765")
    assert sign_in.rules.audiences == frozenset(resources)
    assert sign_in.resource.resource_for("localhost:8765") == "http://localhost:8765"
    # Another port is another resource: not named for it (a token for it is not ours).
    assert sign_in.resource.resource_for("localhost:9999") == "http://127.0.0.1:8765"
    assert json.loads(sign_in.resource.metadata("http://localhost:8765"))["resource"] == (
        "http://localhost:8765"
    )


async def test_a_user_sees_and_ends_only_their_own_sessions_and_operators_see_all(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    alice, bob = issuer.token("alice", PUBLIC), issuer.token("bob", PUBLIC)
    carol = issuer.token("carol", PUBLIC)  # an operator by name
    dave = issuer.token("dave", PUBLIC, groups=["ops"])  # an operator by group
    async with signing_in(tmp_path, issuer, operators=["carol", "group:ops"]) as http:
        hers = await http.post(INITIALIZE, headers=bearer(alice))
        his = await http.post(INITIALIZE, headers=bearer(bob))

        async def listed(token: str) -> set[str]:
            reply = await http.http("GET", "/api/sessions", headers=bearer(token))
            assert reply.status == 200
            return {session["id"] for session in reply.json()["sessions"]}

        assert await listed(alice) == {hers.session}
        assert await listed(bob) == {his.session}
        assert await listed(carol) == await listed(dave) == {hers.session, his.session}
        assert (await http.http("GET", "/metrics", headers=bearer(alice))).status == 403
        assert (await http.http("GET", "/metrics", headers=bearer(carol))).status == 200
        for token in (alice, carol):  # (a user's: their own calls' figures)
            assert (await http.http("GET", "/api/stats", headers=bearer(token))).status == 200
        refused = await http.http("DELETE", f"/api/sessions/{his.session}", headers=bearer(alice))
        assert refused.status == 404
        assert his.session in http.fabric.registry.sessions
        ended = await http.http("DELETE", f"/api/sessions/{his.session}", headers=bearer(dave))
        assert ended.status == 200
        own = await http.http("DELETE", f"/api/sessions/{hers.session}", headers=bearer(alice))
        assert own.status == 200


# --- per-user policy (orchestrator.users) ------------------------------------------------------

TWO_SERVICES = {"svc": Service(image="fake/svc:1"), "other": Service(image="fake/other:1")}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


async def test_a_user_gets_only_their_services_on_the_relay_and_the_fabric_endpoint(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    alice = bearer(issuer.token("alice", PUBLIC))
    async with signing_in(
        tmp_path, issuer, services=TWO_SERVICES, users={"default": UserEntry(services=["svc"])}
    ) as http:
        refused = await http.post(INITIALIZE, path="/mcp/other", headers=alice)
        error = refused.json()["error"]
        assert (error["code"], error["data"]["reason"]) == (-32004, "service_not_allowed")
        assert http.fabric.registry.sessions == {}
        allowed = await http.post(INITIALIZE, path="/mcp/svc", headers=alice)
        assert allowed.json()["id"] == 1
        await http.http("DELETE", "/mcp/svc", headers={**alice, "mcp-session-id": allowed.session})
        fabric = await http.post(INITIALIZE, path="/mcp?tools=all", headers=alice)
        sid = {"mcp-session-id": fabric.session}
        listed = await http.post(TOOLS_LIST, path="/mcp?tools=all", headers={**alice, **sid})
        names = {tool["name"] for tool in listed.json()["result"]["tools"]}
        assert any(name.startswith("svc__") for name in names)
        assert not any(name.startswith("other__") for name in names)
        await http.http("DELETE", "/mcp", headers={**alice, **sid})


async def test_a_user_mounts_only_under_their_own_roots(tmp_path: Path, issuer: FakeIssuer) -> None:
    for user in ("alice", "bob"):
        (tmp_path / "home" / user).mkdir(parents=True)
    alice = bearer(issuer.token("alice", PUBLIC))
    roots = [f"{tmp_path}/home/{{user}}"]
    async with signing_in(
        tmp_path,
        issuer,
        services=TWO_SERVICES,
        users={"default": UserEntry(allowed_mount_roots=roots)},
    ) as http:
        bobs = await http.post(
            INITIALIZE, path=f"/mcp/svc?mount={tmp_path}/home/bob:/workspace", headers=alice
        )
        error = bobs.json()["error"]
        assert (error["code"], error["data"]["reason"]) == (-32004, "mount_outside_allowed_roots")
        # The orchestrator's own root, which holds both homes, is not hers either.
        whole = await http.post(
            INITIALIZE, path=f"/mcp/svc?mount={tmp_path}:/workspace", headers=alice
        )
        assert whole.json()["error"]["data"]["reason"] == "mount_outside_allowed_roots"
        hers = await http.post(
            INITIALIZE, path=f"/mcp/svc?mount={tmp_path}/home/alice:/workspace", headers=alice
        )
        assert hers.json()["id"] == 1
        await http.http("DELETE", "/mcp/svc", headers={**alice, "mcp-session-id": hers.session})


async def test_a_user_at_their_session_limit_is_refused_and_others_are_not(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    alice = bearer(issuer.token("alice", PUBLIC))
    bob = bearer(issuer.token("bob", PUBLIC))
    async with signing_in(
        tmp_path, issuer, services=TWO_SERVICES, users={"alice": UserEntry(max_sessions=1)}
    ) as http:
        first = await http.post(INITIALIZE, headers=alice)
        assert first.json()["id"] == 1
        second = await http.post(INITIALIZE, headers=alice)
        error = second.json()["error"]
        assert (error["code"], error["data"]["reason"]) == (-32002, "user_session_limit")
        assert error["data"]["limit"] == 1
        his = await http.post(INITIALIZE, headers=bob)
        assert his.json()["id"] == 1
        for headers, reply in ((alice, first), (bob, his)):
            await http.http(
                "DELETE", "/mcp/svc", headers={**headers, "mcp-session-id": reply.session}
            )
        again = await http.post(INITIALIZE, headers=alice)
        assert again.json()["id"] == 1
        await http.http("DELETE", "/mcp/svc", headers={**alice, "mcp-session-id": again.session})


def echo(request_id: int, path_tool: str = "echo") -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": path_tool, "arguments": {"text": "hi"}},
    }


async def test_a_users_calls_a_minute_are_counted_across_sessions_and_endpoints(
    tmp_path: Path, issuer: FakeIssuer
) -> None:
    alice = bearer(issuer.token("alice", PUBLIC))
    bob = bearer(issuer.token("bob", PUBLIC))
    async with signing_in(
        tmp_path, issuer, services=TWO_SERVICES, users={"default": UserEntry(calls_per_minute=3)}
    ) as http:
        relay = await http.post(INITIALIZE, headers=alice)
        on_relay = {**alice, "mcp-session-id": relay.session}
        fabric = await http.post(INITIALIZE, path="/mcp?tools=all", headers=alice)
        on_fabric = {**alice, "mcp-session-id": fabric.session}
        answers = [
            await http.post(echo(2), headers=on_relay),
            await http.post(echo(3), headers=on_relay),
            await http.post(echo(4, "svc__echo"), path="/mcp?tools=all", headers=on_fabric),
        ]
        assert all("result" in answer.json() for answer in answers), [a.json() for a in answers]
        for path, headers, name in (
            ("/mcp/svc", on_relay, "echo"),
            ("/mcp?tools=all", on_fabric, "svc__echo"),
        ):
            limited = (await http.post(echo(5, name), path=path, headers=headers)).json()
            error = limited["error"]
            assert (error["code"], error["data"]["reason"]) == (-32002, "rate_limited")
            assert error["data"]["limit"] == 3
            assert 0 < error["data"]["retry_after_seconds"] <= 20
        # Bob's calls are his own.
        his = await http.post(INITIALIZE, headers=bob)
        answered = await http.post(echo(2), headers={**bob, "mcp-session-id": his.session})
        assert "result" in answered.json()
        # The refused calls are audited as calls, with their reason.
        refused = [
            call
            for call in http.fabric.observer.calls
            if call.record["error_reason"] == "rate_limited"
        ]
        assert len(refused) == 2
        assert {call.record["client"]["user"] for call in refused} == {"alice"}
        for headers, reply, path in (
            (alice, relay, "/mcp/svc"),
            (alice, fabric, "/mcp"),
            (bob, his, "/mcp/svc"),
        ):
            await http.http("DELETE", path, headers={**headers, "mcp-session-id": reply.session})
