"""Users signing in, end to end: the real orchestrator process (``auth.mode: oidc``) against a
real OpenID provider (oidc-provider, started here on loopback with alice in team-a and bob in
team-b), the official MCP Python SDK 2.x as the client — which, from the orchestrator's 401,
finds the provider, registers itself, has its user sign in (the test drives the login pages)
and calls a tool in a real container — and the refusals a client gets for every kind of bad
token, with what the audit trail says of who did what."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import httpx2
import jwt
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata
from pydantic import AnyUrl
from selenium.webdriver.common.by import By

from tests.clients import envs
from tests.integration.harness import (
    Orchestrator,
    bridged_client,
    build_test_image,
    claude_mcp,
    orchestrator,
    text_of,
    wait_until,
    write_suite,
)
from tests.integration.test_status_page_e2e import (
    problems_in_console,
    rows,
    wait_for,
)
from tests.messages import INITIALIZE
from tests.oidc_provider import (
    DEFAULT_ACCOUNTS,
    PAGE_CLIENT_ID,
    MemoryTokenStorage,
    OpenIdProvider,
    running_provider,
)

pytestmark = pytest.mark.integration

MCP_HEADERS = {"accept": "application/json, text/event-stream"}
INVALID = "token_invalid"
NO_SCOPE = "token_insufficient_scope"


# Carol, in the contractors' group, whose policy is narrow (see ``fabric``).
ACCOUNTS = {**DEFAULT_ACCOUNTS, "carol": {"groups": ["contractors"], "email": "carol@example.test"}}


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenIdProvider]:
    with running_provider(tmp_path_factory.mktemp("oidc"), accounts=ACCOUNTS) as running:
        yield running


@pytest.fixture(scope="module")
def fabric(
    provider: OpenIdProvider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Orchestrator]:
    root = tmp_path_factory.mktemp("sign-in")
    for user in ("alice", "bob", "carol"):
        (root / "home" / user).mkdir(parents=True)
    suite = write_suite(
        root / "suite.yaml",
        [str(root)],
        users={
            "default": {"allowed_mount_roots": [f"{root}/home/{{user}}"]},
            "group:contractors": {"services": ["time"], "max_sessions": 1, "calls_per_minute": 3},
        },
        # A server that asks for input and keeps what it asked in its process's memory.
        test_services={"asking": {"image": build_test_image("asking")}},
        auth={
            "mode": "oidc",
            "issuer": provider.issuer,
            "scopes": ["mcp"],
            "page_client_id": PAGE_CLIENT_ID,
        },
    )
    with orchestrator(suite, root / "orchestrator.log", token=None) as running:
        yield running


def signing_in_as(provider: OpenIdProvider, user: str, server_url: str) -> OAuthClientProvider:
    """The SDK's OAuth client for ``server_url``, whose user is ``user``: its browser is the
    provider's login pages driven by the test."""
    redirects: list[str] = []

    async def redirect_handler(authorization_url: str) -> None:
        login = provider.login
        redirects.append(await trio.to_thread.run_sync(login, authorization_url, user))

    async def callback_handler() -> AuthorizationCodeResult:
        query = parse_qs(urlsplit(redirects[-1]).query)
        return AuthorizationCodeResult(
            code=query["code"][0], state=query["state"][0], iss=query["iss"][0]
        )

    return OAuthClientProvider(
        server_url=server_url,
        client_metadata=OAuthClientMetadata(
            redirect_uris=[AnyUrl("http://127.0.0.1:33418/callback")],
            client_name=f"sign-in test ({user})",
        ),
        storage=MemoryTokenStorage(),
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )


async def test_an_sdk_client_signs_in_by_itself_from_the_401_and_its_calls_name_the_user(
    fabric: Orchestrator, provider: OpenIdProvider
) -> None:
    url = f"{fabric.http_url}/mcp?tools=all"
    oauth = signing_in_as(provider, "alice", url)
    async with (
        httpx2.AsyncClient(auth=oauth, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert "time__get_current_time" in tools
        result = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert not result.is_error
        assert "UTC" in text_of(result.model_dump(mode="json", by_alias=True))
    stored = oauth.context.current_tokens
    assert stored is not None
    claims = jwt.decode(stored.access_token, options={"verify_signature": False})
    # The token the SDK got is for this orchestrator, named by its metadata.
    assert claims["aud"] == fabric.http_url

    def recorded() -> list[dict[str, Any]]:
        calls = [r for r in fabric.audit() if r.get("event") == "tool_call"]
        return [r for r in calls if r.get("tool") in ("get_current_time", "time__get_current_time")]

    await trio.to_thread.run_sync(lambda: wait_until(lambda: bool(recorded()), 30, "the audit"))
    mine = recorded()
    assert mine[-1]["client"]["user"] == "alice"
    assert mine[-1]["client"]["groups"] == ["team-a"]
    assert mine[-1]["client"]["token"] == "oidc"
    # Nothing of a token lands in the trail or the log.
    for path in (fabric.audit_path, Path(fabric.log_path)):
        assert stored.access_token not in await trio.Path(path).read_text()


def test_the_metadata_and_the_challenge_lead_a_client_to_the_issuer(
    fabric: Orchestrator, provider: OpenIdProvider
) -> None:
    base = fabric.http_url
    with httpx.Client(timeout=30) as http:
        refused = http.post(f"{base}/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        assert refused.status_code == 401
        challenge = refused.headers["www-authenticate"]
        metadata_url = f"{base}/.well-known/oauth-protected-resource"
        assert challenge == f'Bearer resource_metadata="{metadata_url}", scope="mcp"'
        assert refused.json()["error"]["data"]["reason"] == "token_missing"
        for path in ("", "/mcp", "/mcp/time"):
            metadata = http.get(f"{metadata_url}{path}").json()
            assert metadata["resource"] == base
            assert metadata["authorization_servers"] == [provider.issuer]
            assert metadata["scopes_supported"] == ["mcp"]
        # The issuer it names is the provider, whose discovery the client reads next.
        discovery = http.get(f"{provider.issuer}/.well-known/openid-configuration").json()
        assert discovery["issuer"] == provider.issuer
        # localhost is the same orchestrator under another name: its own resource.
        port = urlsplit(base).port
        local = http.get(f"http://localhost:{port}/.well-known/oauth-protected-resource/mcp")
        assert local.json()["resource"] == f"http://localhost:{port}"


def _foreign_token(provider: OpenIdProvider, claims: dict[str, Any]) -> str:
    """Signed with a key of our own under the provider's key id (a forgery)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": provider.kid})


def _unsigned(claims: dict[str, Any]) -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


def test_bad_tokens_are_refused_with_what_is_wrong_and_nothing_starts(
    fabric: Orchestrator, provider: OpenIdProvider
) -> None:
    base = fabric.http_url
    good = provider.claims_for("alice", base)
    cases = [
        ("expired", provider.sign({**good, "exp": 1_000_000, "iat": 999_000}), "token_expired"),
        (
            "for another resource",
            provider.sign({**good, "aud": "http://127.0.0.1:9/mcp"}),
            "token_invalid",
        ),
        (
            "from another issuer",
            provider.sign({**good, "iss": "http://127.0.0.1:9"}),
            "token_invalid",
        ),
        ("unsigned", _unsigned(good), "token_invalid"),
        ("signed with a foreign key", _foreign_token(provider, good), "token_invalid"),
        (
            "without the scope",
            provider.sign({**good, "scope": "email"}),
            "token_insufficient_scope",
        ),
    ]
    with httpx.Client(timeout=30) as http:
        for what, token, reason in cases:
            answer = http.post(
                f"{base}/mcp",
                json=INITIALIZE,
                headers={**MCP_HEADERS, "authorization": f"Bearer {token}"},
            )
            expected = 403 if reason == "token_insufficient_scope" else 401
            assert answer.status_code == expected, what
            error = answer.json()["error"]
            assert (error["code"], error["data"]["reason"]) == (-32004, reason), what
            assert token not in answer.text
            code = "insufficient_scope" if expected == 403 else "invalid_token"
            assert f'error="{code}"' in answer.headers["www-authenticate"], what
        # The real token works, on the same request.
        ok = http.post(
            f"{base}/mcp",
            json=INITIALIZE,
            headers={**MCP_HEADERS, "authorization": f"Bearer {provider.sign(good)}"},
        )
        assert ok.status_code == 200
        http.delete(
            f"{base}/mcp",
            headers={
                "authorization": f"Bearer {provider.sign(good)}",
                "mcp-session-id": ok.headers["mcp-session-id"],
            },
        )
    refusals = [e for e in fabric.logs() if e.get("event") == "request_refused"]
    assert {"token_expired", "token_invalid", "token_insufficient_scope"} <= {
        e.get("reason") for e in refusals
    }


def test_alice_cannot_use_bobs_session_nor_his_keyed_url(
    fabric: Orchestrator, provider: OpenIdProvider
) -> None:
    base = fabric.http_url
    alice = {
        **MCP_HEADERS,
        "authorization": f"Bearer {provider.access_token('alice', base)['access_token']}",
    }
    bob = {
        **MCP_HEADERS,
        "authorization": f"Bearer {provider.access_token('bob', base)['access_token']}",
    }
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    with httpx.Client(timeout=60) as http:
        his = http.post(f"{base}/mcp/time", json=INITIALIZE, headers=bob)
        assert his.status_code == 200
        sid = his.headers["mcp-session-id"]
        stolen = http.post(f"{base}/mcp/time", json=ping, headers={**alice, "mcp-session-id": sid})
        assert stolen.status_code == 404
        gone = http.delete(f"{base}/mcp/time", headers={**alice, "mcp-session-id": sid})
        assert gone.status_code == 404
        own = http.post(f"{base}/mcp/time", json=ping, headers={**bob, "mcp-session-id": sid})
        assert own.status_code == 200
        # The same keyed URL: bob's session for bob, a new one of her own for alice.
        keyed = f"{base}/mcp/fabric/team-notes-1"
        bobs = http.post(keyed, json=INITIALIZE, headers=bob)
        hers = http.post(keyed, json=INITIALIZE, headers=alice)
        assert bobs.status_code == hers.status_code == 200
        assert bobs.headers["mcp-session-id"] != hers.headers["mcp-session-id"]
        for headers, answer in ((bob, his), (bob, bobs), (alice, hers)):
            http.delete(
                f"{base}/mcp",
                headers={**headers, "mcp-session-id": answer.headers["mcp-session-id"]},
            )


def test_bob_cannot_resume_a_call_alice_was_asked_to_give_input_for(
    fabric: Orchestrator, provider: OpenIdProvider
) -> None:
    """A multi-round-trip call (MCP 2026-07-28) on a keyed URL: her requestState, sent by bob
    to the same URL, reaches his own session (and container), which never issued it; she
    resumes her call herself."""
    base = fabric.http_url
    headers = {**MCP_HEADERS, "mcp-protocol-version": "2026-07-28"}
    alice = {
        **headers,
        "authorization": f"Bearer {provider.access_token('alice', base)['access_token']}",
    }
    bob = {
        **headers,
        "authorization": f"Bearer {provider.access_token('bob', base)['access_token']}",
    }
    url = f"{base}/mcp/asking/intake-form-1"

    def call(request_id: int, **more: Any) -> dict[str, Any]:
        params = {"name": "ask_name", "arguments": {}, **more}
        return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}

    with httpx.Client(timeout=120) as http:
        asked = http.post(url, json=call(1), headers=alice).json()["result"]
        assert asked["resultType"] == "input_required", asked
        state = asked["requestState"]
        answer = {"name": {"action": "accept", "content": {"name": "Mallory"}}}
        retry = call(2, requestState=state, inputResponses=answer)
        stolen = http.post(url, json=retry, headers=bob).json()
        assert "Hello" not in json.dumps(stolen)
        assert "error" in stolen or stolen["result"].get("isError"), stolen
        answer = {"name": {"action": "accept", "content": {"name": "Ada"}}}
        retry = call(3, requestState=state, inputResponses=answer)
        hers = http.post(url, json=retry, headers=alice).json()
        assert text_of(hers["result"]).startswith("Hello Ada"), hers


# --- the stdio bridge signs its user in ------------------------------------------------------

HERE = Path(__file__).resolve().parents[1]


def _browsed(log: Path, timeout: float = 60) -> str:
    """The address the bridge asked the browser to open (tests/oidc/record_browser.py)."""
    wait_until(lambda: log.exists() and bool(log.read_text().strip()), timeout, "the browser")
    return log.read_text().splitlines()[-1]


def test_the_bridge_signs_its_user_in_through_the_browser_and_keeps_the_sign_in(
    fabric: Orchestrator, provider: OpenIdProvider, tmp_path: Path
) -> None:
    config, log = tmp_path / "config", tmp_path / "browser.log"
    server_env = {
        "XDG_CONFIG_HOME": str(config),
        "BROWSER": f"{sys.executable} {HERE / 'oidc' / 'record_browser.py'} %s",
        "OIDC_TEST_BROWSER_LOG": str(log),
    }
    client = bridged_client(fabric.http_url + "/mcp", "--no-mount", server_env=server_env)
    try:
        client.send({"op": "initialize"})
        # The user signs in on the page the bridge opened; the provider sends the browser
        # back to the bridge's own loopback address with the code.
        back = provider.login(_browsed(log), "alice")
        assert urlsplit(back).hostname == "127.0.0.1"
        with httpx.Client(timeout=30) as http:
            assert "signed in" in http.get(back).text
        assert client.read_json()["ok"]
        answer = client.ask(
            {"op": "call", "name": "time__get_current_time", "arguments": {"timezone": "UTC"}}
        )
        assert answer["ok"], answer
    finally:
        assert client.close() == 0
    [kept] = list((config / "reactor-fabric" / "sign-in").glob("*.json"))
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    record = json.loads(kept.read_text())
    assert record["issuer"] == provider.issuer
    [tokens] = record["tokens"].values()
    assert tokens["refresh_token"]
    assert jwt.decode(tokens["access_token"], options={"verify_signature": False})["sub"] == "alice"
    # The next bridge uses the sign-in kept: no browser this time.
    again = bridged_client(
        fabric.http_url + "/mcp",
        "--no-mount",
        "--login",
        "none",
        server_env={"XDG_CONFIG_HOME": str(config)},
    )
    try:
        assert again.ask({"op": "initialize"})["ok"]
    finally:
        assert again.close() == 0
    assert len(log.read_text().splitlines()) == 1


def test_login_by_device_code_then_a_bridge_that_may_not_open_a_browser(
    fabric: Orchestrator, provider: OpenIdProvider, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    env = {**os.environ, "XDG_CONFIG_HOME": str(config)}
    login = subprocess.Popen(
        [sys.executable, "-m", "reactor_fabric", "login", fabric.http_url, "--device"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=HERE.parent,
    )
    try:
        assert login.stderr is not None
        line = login.stderr.readline()
        assert "enter the code" in line, line
        address = line.split("visit ", 1)[1].split(" and enter", 1)[0]
        provider.approve_device_code(address, "bob")
        out, err = login.communicate(timeout=60)
        assert login.returncode == 0, err
        assert "signed in" in out
    finally:
        if login.poll() is None:
            login.kill()
            login.wait()
    client = bridged_client(
        fabric.http_url + "/mcp", "--no-mount", "--login", "none",
        server_env={"XDG_CONFIG_HOME": str(config)},
    )  # fmt: skip
    try:
        assert client.ask({"op": "initialize"})["ok"]
        status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
        assert status["ok"], status
    finally:
        assert client.close() == 0

    def bob_started() -> bool:
        starts = [r for r in fabric.audit() if r.get("event") == "session_start"]
        return "bob" in {(r.get("client") or {}).get("user") for r in starts}

    wait_until(bob_started, 30, "bob's session in the audit trail")


def test_a_bridge_that_may_not_sign_in_says_what_to_do(
    fabric: Orchestrator, tmp_path: Path
) -> None:
    client = bridged_client(
        fabric.http_url + "/mcp", "--no-mount", "--login", "none",
        server_env={"XDG_CONFIG_HOME": str(tmp_path / "nothing")},
    )  # fmt: skip
    try:
        answer = client.ask({"op": "initialize"})
        assert not answer["ok"]
        assert "reactor-fabric login" in json.dumps(answer)
    finally:
        client.close()


# --- the status page in a browser: each user their own sessions ---------------------------------


def _sign_in_on_the_page(driver: Any, page: str, user: str) -> None:
    """Open the status page in a browser with nothing kept, and sign in there as ``user``: the
    page sends the browser to the provider's login page, and is brought back signed in."""
    driver.get(page)
    driver.delete_all_cookies()  # (the provider's too: cookies do not tell ports apart)
    driver.execute_script("sessionStorage.clear()")
    driver.get(page)
    login = wait_for(driver, lambda d: d.find_elements(By.NAME, "login"), "the login page")
    login[0].send_keys(user)
    driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    allow = wait_for(
        driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#consent button"), "the consent page"
    )
    allow[0].click()
    wait_for(
        driver,
        lambda d: d.find_element(By.ID, "user").text == f"signed in as {user}",
        f"the page, signed in as {user}",
    )


def test_the_status_page_signs_its_user_in_and_shows_each_their_own_sessions(
    fabric: Orchestrator, provider: OpenIdProvider, browser: Any
) -> None:
    base = fabric.http_url
    opened: dict[str, tuple[dict[str, str], str]] = {}
    with httpx.Client(timeout=60) as http:
        for user in ("alice", "bob"):
            bearer = {
                **MCP_HEADERS,
                "authorization": f"Bearer {provider.access_token(user, base)['access_token']}",
            }
            answer = http.post(f"{base}/mcp/time", json=INITIALIZE, headers=bearer)
            assert answer.status_code == 200
            opened[user] = (bearer, answer.headers["mcp-session-id"])
        try:
            for user, other in (("alice", "bob"), ("bob", "alice")):
                _sign_in_on_the_page(browser, f"{base}/", user)
                mine, theirs = opened[user][1], opened[other][1]
                wait_for(browser, lambda d, s=mine: rows(d, "sessions", session=s), "her row")
                assert rows(browser, "sessions", session=theirs) == []
                assert "code=" not in browser.current_url  # (the page cleaned its address)
            # (The provider's own pages are not ours to judge: a missing favicon there.)
            ours = [m for m in problems_in_console(browser) if m.startswith(base)]
            assert ours == []
        finally:
            for bearer, sid in opened.values():
                http.delete(f"{base}/mcp/time", headers={**bearer, "mcp-session-id": sid})


# --- per-user policy ----------------------------------------------------------------------------


def _bearer(provider: OpenIdProvider, user: str, base: str) -> dict[str, str]:
    token = provider.access_token(user, base)["access_token"]
    return {**MCP_HEADERS, "authorization": f"Bearer {token}"}


def _time_call(request_id: int) -> dict[str, Any]:
    arguments = {"timezone": "UTC"}
    params = {"name": "get_current_time", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def test_alice_mounts_her_own_home_and_not_bobs(
    fabric: Orchestrator, provider: OpenIdProvider
) -> None:
    base = fabric.http_url
    alice = _bearer(provider, "alice", base)
    home = Path(fabric.log_path).parent / "home"
    with httpx.Client(timeout=60) as http:
        refused = http.post(
            f"{base}/mcp/time",
            params={"mount": f"{home}/bob:/workspace"},
            json=INITIALIZE,
            headers=alice,
        )
        error = refused.json()["error"]
        assert (error["code"], error["data"]["reason"]) == (-32004, "mount_outside_allowed_roots")
        hers = http.post(
            f"{base}/mcp/time",
            params={"mount": f"{home}/alice:/workspace"},
            json=INITIALIZE,
            headers=alice,
        )
        assert hers.json()["result"]["serverInfo"], hers.text
        sid = hers.headers["mcp-session-id"]
        http.delete(f"{base}/mcp/time", headers={**alice, "mcp-session-id": sid})


def test_a_contractor_sees_only_her_services_and_is_held_to_her_limits(
    fabric: Orchestrator, provider: OpenIdProvider
) -> None:
    base = fabric.http_url
    carol = _bearer(provider, "carol", base)
    with httpx.Client(timeout=60) as http:
        # The fabric endpoint lists only the services her group may use.
        opened = http.post(f"{base}/mcp?tools=all", json=INITIALIZE, headers=carol)
        sid = {"mcp-session-id": opened.headers["mcp-session-id"]}
        listed = http.post(
            f"{base}/mcp?tools=all",
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            headers={**carol, **sid},
        ).json()["result"]["tools"]
        servers = {tool["name"].split("__")[0] for tool in listed if "__" in tool["name"]}
        assert servers == {"time"}, servers
        # One session at once is hers.
        second = http.post(f"{base}/mcp/time", json=INITIALIZE, headers=carol).json()
        assert second["error"]["data"]["reason"] == "user_session_limit"
        http.delete(f"{base}/mcp", headers={**carol, **sid})
        # Another service is not hers, on the relay either.
        git = http.post(f"{base}/mcp/git", json=INITIALIZE, headers=carol).json()
        assert git["error"]["data"]["reason"] == "service_not_allowed"
        # Three calls a minute.
        relay = http.post(f"{base}/mcp/time", json=INITIALIZE, headers=carol)
        on_relay = {**carol, "mcp-session-id": relay.headers["mcp-session-id"]}
        answers = [
            http.post(f"{base}/mcp/time", json=_time_call(i), headers=on_relay).json()
            for i in range(2, 6)
        ]
        assert all("result" in answer for answer in answers[:3]), answers
        limited = answers[3]["error"]
        assert (limited["code"], limited["data"]["reason"]) == (-32002, "rate_limited")
        assert limited["data"]["retry_after_seconds"] > 0
        http.delete(f"{base}/mcp/time", headers=on_relay)
    refusals = [r for r in fabric.audit() if r.get("event") == "session_refused"]
    assert {("carol", "user_session_limit"), ("carol", "service_not_allowed")} <= {
        ((r.get("client") or {}).get("user"), r.get("reason")) for r in refusals
    }


# --- what other clients make of it ----------------------------------------------------------------


def test_claude_code_sees_an_orchestrator_it_must_sign_in_to(
    fabric: Orchestrator, tmp_path: Path
) -> None:
    """Claude Code, given the URL and nothing else, recognises an OAuth-protected MCP server
    from the 401 and its metadata: it lists it as needing authentication (its `/mcp` command
    then signs in; interactive, not run here), never as failed."""
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    url = f"{fabric.http_url}/mcp"
    claude_mcp(home, project, "add", "--transport", "http", "fabric", url)
    listed = claude_mcp(home, project, "list", timeout=300)
    line = next(entry for entry in listed.splitlines() if entry.startswith("fabric:"))
    assert line == f"fabric: {url} (HTTP) - ! Needs authentication", listed


def test_the_inspector_cli_reports_that_it_must_sign_in(
    fabric: Orchestrator, tmp_path: Path
) -> None:
    """MCP Inspector's CLI without a stored sign-in (it signs in only interactively) fails with
    its authentication exit status and the orchestrator's words."""
    done = subprocess.run(
        [
            *envs.inspector_cli(),
            f"{fabric.http_url}/mcp",
            "--transport",
            "http",
            "--stored-auth-only",
            "--method",
            "tools/list",
        ],
        env={**os.environ, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3, (done.stdout, done.stderr)
    printed = [line for line in done.stderr.splitlines() if line.startswith("{")]
    error = json.loads(printed[-1])["error"]
    assert error["code"] == "auth_required"
    assert "sign in with the orchestrator's OpenID provider" in error["message"]
    assert "token_missing" in error["message"]
