"""Per-service secrets: the suite's form, resolution of each source, the file's mode check,
and that no message ever carries a value."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from reactor_fabric import check_suite_text
from reactor_fabric._cli import main
from reactor_fabric.config.secrets import (
    MAX_SECRET_BYTES,
    SecretUnreadable,
    read_secret_file,
    resolve_suite_secrets,
)
from reactor_fabric.config.structs import Suite

VALUE = "ghp_s3cr3t-value-never-shown"

SUITE = """\
version: "1.0"
orchestrator:
  allowed_mount_roots: []
mcp_services:
  github:
    image: "ghcr.io/github/github-mcp-server:1"
    secrets:
{secrets}
  time:
    image: "reactor-fabric/mcp-server-time:2026.10.19"
"""


def suite_with(secrets: str) -> tuple[Suite | None, list[str]]:
    text = SUITE.format(secrets=textwrap.indent(textwrap.dedent(secrets), " " * 6))
    result = check_suite_text(text, source="suite.yaml")
    return result.suite, [str(issue) for issue in result.issues]


def test_a_service_takes_secrets_from_its_environment_or_a_file_delivered_both_ways() -> None:
    suite, issues = suite_with(
        """\
        GITHUB_PERSONAL_ACCESS_TOKEN: {env: GH_TOKEN}
        DB_PASSWORD: {file: /home/me/.config/db-password, as: file}
        """
    )
    assert issues == []
    assert suite is not None
    secrets = suite.mcp_services["github"].secrets
    assert secrets["GITHUB_PERSONAL_ACCESS_TOKEN"].env == "GH_TOKEN"
    assert secrets["GITHUB_PERSONAL_ACCESS_TOKEN"].as_ == "both"
    assert secrets["DB_PASSWORD"].file == "/home/me/.config/db-password"
    assert secrets["DB_PASSWORD"].as_ == "file"
    assert suite.mcp_services["time"].secrets == {}


@pytest.mark.parametrize(
    ("secrets", "expected"),
    [
        (
            "TOKEN: {env: A, file: /b}",
            "suite.yaml:8:14: mcp_services.github.secrets.TOKEN: give exactly one source",
        ),
        (
            "TOKEN: {as: env}",
            "suite.yaml:8:14: mcp_services.github.secrets.TOKEN: give exactly one source",
        ),
        (
            "TOKEN: {file: relative/path}",
            "suite.yaml:8:21: mcp_services.github.secrets.TOKEN.file: 'relative/path' does "
            "not match",
        ),
        (
            "TOKEN: {env: X, as: disk}",
            "suite.yaml:8:27: mcp_services.github.secrets.TOKEN.as: 'disk' is not one of",
        ),
        ("TOKEN: {env: X, from: y}", "mcp_services.github.secrets.TOKEN.from: unknown key"),
        (
            "1BAD: {env: X}",
            "suite.yaml:8:7: mcp_services.github.secrets.1BAD: name '1BAD' is not allowed: "
            "a secret's name is its environment variable's",
        ),
    ],
)
def test_a_malformed_secret_is_reported_with_its_line_and_key(secrets: str, expected: str) -> None:
    _suite, issues = suite_with(secrets)
    assert len(issues) == 1, issues
    assert issues[0].startswith(expected) or expected in issues[0], issues


def test_a_secret_cannot_share_its_name_with_an_env_entry_or_a_variable_of_ours() -> None:
    text = SUITE.format(
        secrets="      TOKEN: {env: X}\n      REACTOR_FABRIC_SERVICE_CONFIG: {env: Y}\n"
        "      REACTOR_FABRIC_ISOLATION: {env: Z}\n"
    ).replace(
        "    secrets:\n",
        "    env: {TOKEN: plain}\n    secrets:\n",
    )
    issues = [str(i) for i in check_suite_text(text, source="suite.yaml").issues]
    assert len(issues) == 3, issues
    assert "secrets.TOKEN: 'TOKEN' is also set under env" in issues[0]
    assert "REACTOR_FABRIC_SERVICE_CONFIG is reserved" in issues[1]
    assert "REACTOR_FABRIC_ISOLATION is reserved: it marks a container for gVisor" in issues[2]


def secret_file(tmp_path: Path, mode: int, content: str = VALUE + "\n") -> Path:
    path = tmp_path / "token"
    path.write_text(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_file_only_its_owner_reads_gives_its_value_without_the_trailing_newline(
    tmp_path: Path, mode: int
) -> None:
    assert read_secret_file(str(secret_file(tmp_path, mode))) == VALUE


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o620])
def test_a_file_others_may_read_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    path = secret_file(tmp_path, mode)
    with pytest.raises(SecretUnreadable) as caught:
        read_secret_file(str(path))
    message = str(caught.value)
    assert f"mode {mode:04o}" in message
    assert f"fix: chmod 600 {path}" in message
    assert VALUE not in message


def test_a_file_of_another_user_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = secret_file(tmp_path, 0o600)
    other = os.geteuid() + 1
    with pytest.raises(SecretUnreadable, match=rf"not by the orchestrator's user.*chown {other}"):
        read_secret_file(str(path), uid=other)


def test_a_symlink_a_directory_a_missing_or_an_oversized_file_is_refused(tmp_path: Path) -> None:
    real = secret_file(tmp_path, 0o600)
    link = tmp_path / "link"
    link.symlink_to(real)
    big = tmp_path / "big"
    big.write_text("x" * (MAX_SECRET_BYTES + 1))
    big.chmod(0o600)
    for path, why in [
        (link, "cannot open"),
        (tmp_path, "not a regular file"),
        (tmp_path / "absent", "no such file"),
        (big, "more than a secret may hold"),
    ]:
        with pytest.raises(SecretUnreadable, match=why):
            read_secret_file(str(path))


def test_resolution_refuses_only_the_service_whose_source_is_missing(tmp_path: Path) -> None:
    text = SUITE.format(
        secrets=f"      TOKEN: {{env: GH_TOKEN}}\n      KEY: {{file: {tmp_path}/absent}}\n"
    )
    text += '  sentry:\n    image: "sentry:1"\n    secrets: {DSN: {env: SENTRY_DSN, as: env}}\n'
    suite = check_suite_text(text, source="suite.yaml").suite
    assert suite is not None
    resolved = resolve_suite_secrets(suite, environ={"GH_TOKEN": VALUE, "SENTRY_DSN": VALUE + "2"})
    assert set(resolved) == {"github", "sentry"}  # time has none
    assert not resolved["github"].available
    assert resolved["github"].secrets == ()
    assert resolved["github"].problems == (f"secret KEY: {tmp_path}/absent: no such file",)
    sentry = resolved["sentry"]
    assert sentry.available
    assert [(s.name, s.as_env, s.as_file) for s in sentry.secrets] == [("DSN", True, False)]
    assert VALUE not in repr(resolved)


def test_an_unset_or_empty_variable_is_a_problem_that_names_it_not_a_value() -> None:
    suite, _ = suite_with("A: {env: UNSET_ONE}\nB: {env: EMPTY_ONE}\n")
    assert suite is not None
    problems = resolve_suite_secrets(suite, environ={"EMPTY_ONE": ""})["github"].problems
    assert problems == (
        "secret A: the variable UNSET_ONE is not set in the orchestrator's environment",
        "secret B: the value has fewer than 4 characters (empty?)",
    )


def test_validate_config_with_secrets_resolves_every_source_and_prints_no_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    token = secret_file(tmp_path, 0o644)
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        SUITE.format(secrets=f"      TOKEN: {{env: RF_TEST_TOKEN}}\n      KEY: {{file: {token}}}\n")
    )
    monkeypatch.setenv("RF_TEST_TOKEN", VALUE)
    assert main(["validate-config", str(suite)]) == 0  # without --secrets: the form only
    capsys.readouterr()
    assert main(["validate-config", "--secrets", str(suite)]) == 1
    out, err = capsys.readouterr()
    assert f"service github: secret KEY: {token}: mode 0644" in err
    assert f"fix: chmod 600 {token}" in err
    token.chmod(0o600)
    assert main(["validate-config", "--secrets", str(suite)]) == 0
    out2, err2 = capsys.readouterr()
    assert "service github: secrets resolve (TOKEN, KEY)" in out2
    assert VALUE not in out + err + out2 + err2


EGRESS_SUITE = """\
version: "1.0"
orchestrator: {{allowed_mount_roots: ["/tmp/"]}}
mcp_services:
  github:
    image: "ghcr.io/github/github-mcp-server:1"
{fields}
"""


def egress_issues(fields: str) -> list[str]:
    text = EGRESS_SUITE.format(fields=textwrap.indent(textwrap.dedent(fields), "    "))
    return [str(i) for i in check_suite_text(text, source="suite.yaml").issues]


def test_an_egress_list_of_hosts_and_ports_is_valid() -> None:
    assert egress_issues('egress: ["api.github.com:443", "127.0.0.1:8080", "[::1]:80"]') == []
    assert egress_issues("egress: []") == []
    assert egress_issues('egress: ["api.github.com:443"]\nnetwork: "none"') == []


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("api.github.com", "write host:port"),
        ("api.github.com:0", "the port must be a number from 1 to 65535"),
        ("::1:80", "in brackets"),
        ("127.1:80", "neither a dotted-quad address nor a name"),
    ],
)
def test_an_egress_entry_that_is_not_host_and_port_is_reported_at_its_line(
    entry: str, expected: str
) -> None:
    (issue,) = egress_issues(f'egress: ["api.github.com:443", "{entry}"]')
    assert issue.startswith("suite.yaml:6:")
    assert "mcp_services.github.egress[1]" in issue
    assert expected in issue


def test_egress_and_a_network_other_than_none_exclude_each_other() -> None:
    (issue,) = egress_issues('egress: ["api.github.com:443"]\nnetwork: "bridge"')
    assert "mcp_services.github.network" in issue
    assert "exclude each other" in issue
