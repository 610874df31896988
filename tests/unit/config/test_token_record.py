"""Each orchestrator's token recorded by port: where the bridge finds it, in which order, and
that only the user's own private files are written, read and removed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from trio_websocket import ConnectionRejected

from reactor_fabric.config.token import TOKEN_ENV, TokenError, load_or_create_token
from reactor_fabric.config.token_record import (
    find_bridge_token,
    read_record,
    record_directories,
    record_name,
    remove_record,
    write_record,
)
from reactor_fabric.trio.bridge import BridgeSettings, _rejection_error, dialled_port

RECORDED = "r" * 43
FROM_ENV = "e" * 43


@pytest.fixture
def run_user(tmp_path: Path) -> Path:
    """Stands for /run/user: empty unless a test makes the user's directory in it."""
    path = tmp_path / "run-user"
    path.mkdir()
    return path


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    # What a client's filtered environment passes the bridge: HOME, no XDG_* variables.
    return {"HOME": str(tmp_path / "home"), **extra}


def own_runtime_dir(run_user: Path) -> Path:
    path = run_user / str(os.geteuid())
    path.mkdir(mode=0o700)
    return path


def test_the_bridge_takes_the_variable_then_the_ports_record_then_the_default_file(
    tmp_path: Path, run_user: Path
) -> None:
    environ = env_for(tmp_path)
    from_file = load_or_create_token(environ).value
    write_record(environ, 8765, RECORDED, run_user=run_user)
    found = find_bridge_token({**environ, TOKEN_ENV: FROM_ENV}, 8765, run_user=run_user)
    assert found is not None
    assert found.value == FROM_ENV
    found = find_bridge_token(environ, 8765, run_user=run_user)
    record = tmp_path / "home/.config/reactor-fabric" / record_name(8765)
    assert found is not None
    assert (found.value, found.origin) == (RECORDED, str(record))
    # Another port's orchestrator on loopback: the default file.
    found = find_bridge_token(environ, 8766, run_user=run_user)
    assert found is not None
    assert found.value == from_file


def test_another_machine_is_sent_only_the_variable_never_a_local_orchestrators_token(
    tmp_path: Path, run_user: Path
) -> None:
    # (port None: the URL is not this machine's loopback; the record and the default file hold
    # local orchestrators' tokens, which another host that happens to use the port must not get.)
    environ = env_for(tmp_path)
    load_or_create_token(environ)
    write_record(environ, 8765, RECORDED, run_user=run_user)
    assert find_bridge_token(environ, None, run_user=run_user) is None
    found = find_bridge_token({**environ, TOKEN_ENV: FROM_ENV}, None, run_user=run_user)
    assert found is not None
    assert found.value == FROM_ENV


def test_without_any_token_the_bridge_finds_none_and_makes_nothing(
    tmp_path: Path, run_user: Path
) -> None:
    assert find_bridge_token(env_for(tmp_path), 8765, run_user=run_user) is None
    assert not (tmp_path / "home").exists()


def test_the_record_is_private_written_whole_and_replaces_a_killed_orchestrators(
    tmp_path: Path, run_user: Path
) -> None:
    environ = env_for(tmp_path)
    stale = write_record(environ, 8765, "s" * 43, run_user=run_user)  # its writer was killed
    fresh = write_record(environ, 8765, RECORDED, run_user=run_user)
    assert fresh.path == stale.path
    assert stat.S_IMODE(fresh.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(fresh.path.parent.stat().st_mode) == 0o700
    assert [p.name for p in fresh.path.parent.iterdir()] == [record_name(8765)]  # no scratch
    assert RECORDED.encode() in fresh.path.read_bytes()
    found = read_record(environ, 8765, run_user=run_user)
    assert found is not None
    assert found.value == RECORDED


def test_an_orchestrator_removes_its_record_at_exit_but_not_one_written_after_it(
    tmp_path: Path, run_user: Path
) -> None:
    environ = env_for(tmp_path)
    first = write_record(environ, 8765, RECORDED, run_user=run_user)
    # Another orchestrator of the user on the same port (another address), same token even.
    second = write_record(environ, 8765, RECORDED, run_user=run_user)
    assert not remove_record(first)
    assert read_record(environ, 8765, run_user=run_user) is not None
    assert remove_record(second)
    assert not second.path.exists()
    assert not remove_record(second)  # gone already: nothing to do, no error


def test_the_users_runtime_directory_comes_first_and_is_found_without_xdg_runtime_dir(
    tmp_path: Path, run_user: Path
) -> None:
    runtime = own_runtime_dir(run_user)
    # The orchestrator's shell sets XDG_RUNTIME_DIR; the bridge's client passes only HOME.
    written = write_record(
        env_for(tmp_path, XDG_RUNTIME_DIR=str(runtime)), 8765, RECORDED, run_user=run_user
    )
    assert written.path == runtime / "reactor-fabric" / record_name(8765)
    found = find_bridge_token(env_for(tmp_path), 8765, run_user=run_user)
    assert found is not None
    assert found.value == RECORDED


def test_a_runtime_directory_others_may_enter_is_not_used_for_records(
    tmp_path: Path, run_user: Path
) -> None:
    runtime = own_runtime_dir(run_user)
    runtime.chmod(0o755)
    elsewhere = tmp_path / "shared"
    elsewhere.mkdir(mode=0o777)
    elsewhere.chmod(0o777)
    environ = env_for(tmp_path, XDG_RUNTIME_DIR=str(elsewhere))
    assert record_directories(environ, os.geteuid(), run_user) == [
        tmp_path / "home/.config/reactor-fabric"
    ]
    written = write_record(environ, 8765, RECORDED, run_user=run_user)
    assert written.path.parent == tmp_path / "home/.config/reactor-fabric"


def test_a_symlinked_record_is_refused_not_followed(tmp_path: Path, run_user: Path) -> None:
    environ = env_for(tmp_path)
    written = write_record(environ, 8765, RECORDED, run_user=run_user)
    chosen = tmp_path / "chosen"
    chosen.write_text("c" * 43)
    chosen.chmod(0o600)
    written.path.unlink()
    written.path.symlink_to(chosen)
    with pytest.raises(TokenError, match="symlink"):
        find_bridge_token(environ, 8765, run_user=run_user)
    assert not remove_record(written)
    assert chosen.exists()


def test_a_symlinked_record_directory_is_refused_for_writing_and_reading(
    tmp_path: Path, run_user: Path
) -> None:
    environ = env_for(tmp_path)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (target / record_name(8765)).write_text(f"{RECORDED}\n")
    (target / record_name(8765)).chmod(0o600)
    config = tmp_path / "home/.config"
    config.mkdir(parents=True)
    (config / "reactor-fabric").symlink_to(target)
    with pytest.raises(TokenError, match="symlink"):
        write_record(environ, 8765, RECORDED, run_user=run_user)
    with pytest.raises(TokenError, match="symlink"):
        find_bridge_token(environ, 8765, run_user=run_user)


def test_a_record_directory_others_may_write_is_refused(tmp_path: Path, run_user: Path) -> None:
    environ = env_for(tmp_path)
    written = write_record(environ, 8765, RECORDED, run_user=run_user)
    written.path.parent.chmod(0o775)
    with pytest.raises(TokenError, match="chmod 700"):
        write_record(environ, 8765, RECORDED, run_user=run_user)
    with pytest.raises(TokenError, match="writable by other users"):
        find_bridge_token(environ, 8765, run_user=run_user)
    # Without a record for the port there, the bridge goes on to the default file as before.
    written.path.unlink()
    assert find_bridge_token(environ, 8765, run_user=run_user) is None


def test_the_users_own_readable_configuration_directory_may_hold_records(
    tmp_path: Path, run_user: Path
) -> None:
    # ~/.config/reactor-fabric also holds the user's suite; mkdir made it 0755.
    environ = env_for(tmp_path)
    (tmp_path / "home/.config/reactor-fabric").mkdir(parents=True, mode=0o755)
    write_record(environ, 8765, RECORDED, run_user=run_user)
    found = find_bridge_token(environ, 8765, run_user=run_user)
    assert found is not None
    assert found.value == RECORDED


def test_a_record_others_may_read_is_refused(tmp_path: Path, run_user: Path) -> None:
    environ = env_for(tmp_path)
    written = write_record(environ, 8765, RECORDED, run_user=run_user)
    written.path.chmod(0o644)
    with pytest.raises(TokenError, match="readable or writable by others"):
        find_bridge_token(environ, 8765, run_user=run_user)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_a_record_or_record_directory_of_another_user_is_refused(
    tmp_path: Path, run_user: Path
) -> None:
    environ = env_for(tmp_path)
    written = write_record(environ, 8765, RECORDED, run_user=run_user)
    os.chown(written.path, 4001, 4001)
    with pytest.raises(TokenError, match="not to you"):
        find_bridge_token(environ, 8765, run_user=run_user)
    os.chown(written.path.parent, 4001, 4001)
    with pytest.raises(TokenError, match="not to you"):
        write_record(environ, 8765, RECORDED, run_user=run_user)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another uid needs root")
def test_another_users_runtime_directory_is_not_used(tmp_path: Path, run_user: Path) -> None:
    runtime = own_runtime_dir(run_user)
    os.chown(runtime, 4001, 4001)
    environ = env_for(tmp_path, XDG_RUNTIME_DIR=str(runtime))
    assert record_directories(environ, os.geteuid(), run_user) == [
        tmp_path / "home/.config/reactor-fabric"
    ]


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("ws://127.0.0.1:8765", 8765),
        ("ws://localhost:9000/mcp/time", 9000),
        ("http://[::1]:8765/mcp", 8765),
        ("ws://127.0.0.1", 80),
        ("wss://localhost/mcp", 443),
        # Another machine may use the same port: a local orchestrator's token never goes there.
        ("ws://example.org:8765", None),
        ("ws://192.168.1.5:8765", None),
    ],
)
def test_the_bridge_uses_a_ports_record_only_for_a_loopback_url(url: str, port: int | None) -> None:
    assert dialled_port(url) == port


def test_a_refused_token_says_where_the_bridge_found_it_and_where_it_looks() -> None:
    body = (
        b'{"jsonrpc": "2.0", "id": null, "error": {"code": -32004, "message": "Security '
        b'Violation", "data": {"reason": "token_invalid", "detail": "wrong token"}}}'
    )
    settings = BridgeSettings(
        endpoint="ws://127.0.0.1:8765",
        service="fabric",
        mounts=[],
        config=None,
        token=RECORDED,
        token_origin="/run/user/1000/reactor-fabric/port-8765.token",
        token_places="REACTOR_FABRIC_TOKEN, then A, then B",
    )
    error = _rejection_error(ConnectionRejected(401, (), body), settings)
    assert error["data"]["reason"] == "token_invalid"
    assert "/run/user/1000/reactor-fabric/port-8765.token" in error["data"]["detail"]
    assert "REACTOR_FABRIC_TOKEN, then A, then B" in error["data"]["detail"]
    assert RECORDED not in error["data"]["detail"]
    # On the line a message-only client shows, too.
    assert error["message"].startswith(
        "Security Violation: the orchestrator refused the token from "
        "/run/user/1000/reactor-fabric/port-8765.token; the bridge looks in REACTOR_FABRIC_TOKEN"
    )
