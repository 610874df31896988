"""The bridge's sign-in, its pure parts and its guards: the challenge read, the resource that
must be the orchestrator dialled, and the private file the sign-ins are kept in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from reactor_fabric.config.sign_in_store import load_sign_in, save_sign_in, sign_in_file
from reactor_fabric.config.token import TokenError
from reactor_fabric.trio.sign_in_client import (
    SignInClient,
    SignInError,
    browser_command,
    open_browser,
    resource_metadata_url,
    same_server,
)


@pytest.mark.parametrize(
    ("challenge", "found"),
    [
        (
            'Bearer resource_metadata="https://f.example/.well-known/oauth-protected-resource"',
            "https://f.example/.well-known/oauth-protected-resource",
        ),
        (
            'bearer scope="mcp", resource_metadata="http://127.0.0.1:9/x", error="invalid_token"',
            "http://127.0.0.1:9/x",
        ),
        ('Bearer realm="reactor-fabric", error_description="send the token"', None),
        ('Basic realm="x"', None),
        ("", None),
    ],
)
def test_the_resource_metadata_is_read_from_a_bearer_challenge(
    challenge: str, found: str | None
) -> None:
    assert resource_metadata_url(challenge) == found


@pytest.mark.parametrize(
    ("resource", "dialled", "same"),
    [
        ("http://127.0.0.1:8765", "ws://127.0.0.1:8765/mcp", True),
        ("https://fabric.example.com", "wss://fabric.example.com/mcp/time", True),
        ("https://fabric.example.com:443", "wss://fabric.example.com/mcp", True),
        ("http://127.0.0.1:8766", "ws://127.0.0.1:8765/mcp", False),
        ("http://localhost:8765", "ws://127.0.0.1:8765/mcp", False),
        ("https://fabric.example.com", "ws://fabric.example.com/mcp", False),
        ("https://evil.example.com", "wss://fabric.example.com/mcp", False),
        ("file:///etc/passwd", "ws://127.0.0.1:8765/mcp", False),
    ],
)
def test_a_resource_is_the_dialled_orchestrator_only_by_scheme_host_and_port(
    resource: str, dialled: str, same: bool
) -> None:
    assert same_server(resource, dialled) is same


async def test_metadata_named_elsewhere_is_not_followed(tmp_path: Path) -> None:
    client = SignInClient({"XDG_CONFIG_HOME": str(tmp_path)}, "ws://127.0.0.1:8765/mcp")
    for metadata in (
        "https://evil.example.com/.well-known/oauth-protected-resource",
        "http://10.0.0.5:8765/.well-known/oauth-protected-resource",
    ):
        with pytest.raises(SignInError, match="elsewhere"):
            with trio.fail_after(5):
                await client.access_token(metadata)


def test_sign_ins_are_kept_private_and_refused_when_they_are_not(tmp_path: Path) -> None:
    environ = {"XDG_CONFIG_HOME": str(tmp_path)}
    path = sign_in_file(environ, "https://login.example.com")
    assert path.parent == tmp_path / "reactor-fabric" / "sign-in"
    assert load_sign_in(path) is None
    save_sign_in(path, {"issuer": "https://login.example.com", "tokens": {}})
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(path.parent).st_mode & 0o777 == 0o700
    assert load_sign_in(path) == {"issuer": "https://login.example.com", "tokens": {}}
    path.chmod(0o644)
    with pytest.raises(TokenError, match="readable or writable by others"):
        load_sign_in(path)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(TokenError, match="symlink"):
        load_sign_in(path)
    path.unlink()
    path.write_text("[1, 2]")
    path.chmod(0o600)
    with pytest.raises(TokenError, match="not a sign-in record"):
        load_sign_in(path)
    assert sign_in_file(environ, "https://a.example") != sign_in_file(environ, "https://b.example")


def test_the_browser_is_the_users_own_command_never_a_console_one(tmp_path: Path) -> None:
    url = "https://login.example.com/auth?x=1"
    assert browser_command({"BROWSER": "firefox --new-tab %s:chromium"}, url) == [
        "firefox",
        "--new-tab",
        url,
    ]
    assert browser_command({"BROWSER": "my-browser"}, url) == ["my-browser", url]
    opener = tmp_path / "xdg-open"
    opener.write_text("#!/bin/sh\n")
    opener.chmod(0o755)
    assert browser_command({"PATH": str(tmp_path)}, url) == [str(opener), url]
    # lynx and w3m are on this PATH, but never taken: they would use the bridge's stdio.
    for console in ("lynx", "w3m", "www-browser"):
        (tmp_path / console).write_text("#!/bin/sh\n")
        (tmp_path / console).chmod(0o755)
    opener.unlink()
    assert browser_command({"PATH": str(tmp_path)}, url) is None


def test_a_browser_gets_none_of_the_bridges_stdio(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    browser = tmp_path / "browser"
    browser.write_text('#!/bin/sh\necho "opened $1"\nread line && echo "read $line"\nexit 0\n')
    browser.chmod(0o755)
    assert open_browser({"BROWSER": str(browser), "PATH": "/usr/bin:/bin"}, "https://x.example/")
    out, err = capfd.readouterr()
    assert out == ""  # (stdout is the MCP client's)
    assert "opened https://x.example/" in err
    assert "read" not in err  # its stdin was /dev/null
    assert not open_browser({"BROWSER": str(browser)}, "file:///etc/passwd")
    assert not open_browser({"BROWSER": str(browser)}, "--help")
