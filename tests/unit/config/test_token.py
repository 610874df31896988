"""The token file: made private, refused when it is not, agreed on by racing starts."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from reactor_fabric.config.token import (
    TOKEN_ENV,
    TokenError,
    create_token_file,
    find_token,
    load_or_create_token,
    read_token_file,
    token_file,
)


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"XDG_CONFIG_HOME": str(tmp_path / "config"), "HOME": str(tmp_path), **extra}


def test_the_first_start_makes_a_private_token_file_and_later_ones_reuse_it(
    tmp_path: Path,
) -> None:
    environ = env_for(tmp_path)
    made = load_or_create_token(environ)
    path = tmp_path / "config" / "reactor-fabric" / "token"
    assert made.origin == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(made.value) >= 40  # 32 random bytes, URL-safe base64
    assert load_or_create_token(environ) == made
    assert [p.name for p in path.parent.iterdir()] == ["token"]  # no scratch file left


def test_without_xdg_config_home_the_file_is_under_home(tmp_path: Path) -> None:
    assert token_file({"HOME": str(tmp_path)}) == tmp_path / ".config/reactor-fabric/token"


def test_the_command_line_wins_over_the_environment_which_wins_over_the_file(
    tmp_path: Path,
) -> None:
    environ = env_for(tmp_path)
    from_file = load_or_create_token(environ).value
    from_env = "e" * 20
    explicit = "x" * 20
    assert find_token({**environ, TOKEN_ENV: from_env}, explicit).value == explicit  # type: ignore[union-attr]
    assert find_token({**environ, TOKEN_ENV: from_env}).value == from_env  # type: ignore[union-attr]
    assert find_token(environ).value == from_file  # type: ignore[union-attr]


def test_without_a_token_anywhere_finding_one_makes_nothing(tmp_path: Path) -> None:
    assert find_token(env_for(tmp_path)) is None
    assert not (tmp_path / "config").exists()


@pytest.mark.parametrize(
    "value", ["short", "x" * 513, "has space inside 0123", 'quote"0123456789ab']
)
def test_a_token_unfit_for_a_header_or_a_url_or_too_short_is_refused(value: str) -> None:
    with pytest.raises(TokenError):
        find_token({}, value)


def test_a_token_file_others_may_read_is_refused_not_used(tmp_path: Path) -> None:
    environ = env_for(tmp_path)
    load_or_create_token(environ)
    path = token_file(environ)
    path.chmod(0o644)
    with pytest.raises(TokenError, match="chmod 600"):
        load_or_create_token(environ)


def test_a_symlinked_token_file_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "chosen-by-someone-else"
    elsewhere.write_text("a" * 32)
    elsewhere.chmod(0o600)
    path = token_file(env_for(tmp_path))
    path.parent.mkdir(parents=True)
    path.symlink_to(elsewhere)
    with pytest.raises(TokenError, match="symlink"):
        read_token_file(path)


def test_a_token_path_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    path = token_file(env_for(tmp_path))
    path.mkdir(parents=True)
    with pytest.raises(TokenError):
        read_token_file(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_a_token_file_of_another_user_is_refused(tmp_path: Path) -> None:
    environ = env_for(tmp_path)
    load_or_create_token(environ)
    os.chown(token_file(environ), 4001, 4001)
    with pytest.raises(TokenError, match="not to you"):
        load_or_create_token(environ)


def test_starts_racing_to_make_the_file_agree_on_one_token(tmp_path: Path) -> None:
    path = token_file(env_for(tmp_path))
    results: list[str] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        results.append(create_token_file(path))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1
    assert read_token_file(path) == results[0]
    assert [p.name for p in path.parent.iterdir()] == ["token"]
