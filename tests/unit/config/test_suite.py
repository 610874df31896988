"""The suite file: what is accepted, and what each mistake is reported as (file, line, key)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from reactor_fabric import InvalidSuiteConfiguration, SuiteUnreadable, check_suite_text, load_suite
from reactor_fabric.config.suite import format_path

REPO = Path(__file__).resolve().parents[3]

MINIMAL = """\
version: "1.0"
orchestrator:
  allowed_mount_roots: ["/home/"]
mcp_services:
  time:
    image: "reactor-fabric/mcp-server-time:2026.10.19"
"""


def check(text: str) -> list[str]:
    result = check_suite_text(textwrap.dedent(text), source="suite.yaml")
    return [str(issue) for issue in result.issues]


def test_the_bundled_suite_is_valid_and_defines_the_four_reference_services() -> None:
    suite = load_suite(REPO / "claude-mcp-suite.yaml")
    assert {"time", "git", "filesystem", "everything"} <= set(suite.mcp_services)
    for service in suite.mcp_services.values():
        assert service.description
        assert service.image.startswith("reactor-fabric/")


def test_a_minimal_suite_gets_the_documented_defaults() -> None:
    result = check_suite_text(MINIMAL, source="suite.yaml")
    assert result.issues == []
    assert result.suite is not None
    service = result.suite.mcp_services["time"]
    assert service.timeout == "1m"
    assert service.idle_timeout_seconds == 60
    assert service.resources.memory_bytes == 512 * 1024 * 1024
    assert service.resources.cpus == 1.0
    assert service.resources.pids == 256
    assert service.pull == "missing"
    assert service.network is None
    assert service.security.no_new_privileges is True
    assert service.security.cap_add == []
    assert service.command is None
    assert service.config == {}
    orchestrator = result.suite.orchestrator
    assert orchestrator.max_sessions == 64
    assert orchestrator.max_message_bytes == 16 * 1024 * 1024
    assert orchestrator.network == "bridge"
    assert orchestrator.allowed_origins == []
    assert orchestrator.warm_pool.refill_hold_seconds == 0.5


def test_a_pools_refill_hold_may_be_turned_off_or_set_within_ten_seconds() -> None:
    def hold(value: str) -> tuple[list[str], float | None]:
        text = MINIMAL.replace('["/home/"]', f'["/home/"]\n  warm_pool: {{refill_hold: {value}}}')
        result = check_suite_text(text, source="suite.yaml")
        held = result.suite.orchestrator.warm_pool.refill_hold_seconds if result.suite else None
        return [str(issue) for issue in result.issues], held

    assert hold("null") == ([], 0.0)
    assert hold('"2s"') == ([], 2.0)
    assert hold('"10s"') == ([], 10.0)
    said, _ = hold('"11s"')
    assert len(said) == 1
    assert "orchestrator.warm_pool.refill_hold: '11s' is longer than 10s" in said[0]
    said, _ = hold('"0s"')
    assert len(said) == 1
    assert "must be a positive duration" in said[0]
    said, _ = hold('"soon"')
    assert len(said) == 1
    assert "'soon' is not a duration; use a number and a unit" in said[0]


def test_the_seed_example_suite_with_every_original_field_is_valid() -> None:
    issues = check(
        """\
        version: "1.0"
        orchestrator:
          allowed_mount_roots: ["/home/", "/Users/", "/mnt/", "/media/", "/projects/"]
        mcp_services:
          filesystem:
            image: "ghcr.io/modelcontextprotocol/server-filesystem:latest"
            timeout: "1m"
          python_expert:
            image: "ghcr.io/dyluth/claude-reactor/python:latest"
            timeout: "10m"
            config:
              account: "work_account"
              danger_mode: false
              specialty: "Expert in Python, Django, and data analysis."
        """
    )
    assert issues == []


def test_every_optional_field_is_accepted_with_its_typed_value() -> None:
    result = check_suite_text(
        textwrap.dedent(
            """\
            version: "1.0"
            orchestrator:
              allowed_mount_roots: ["/srv/projects"]
              allowed_origins: ["https://app.example.com"]
              max_sessions: 10
              max_message_size: "4m"
              network: "fabric-net"
            mcp_services:
              git:
                image: "registry.example.com/tools/git@sha256:abc"
                description: "git"
                timeout: "5m30s"
                command: ["--repository", "/workspace"]
                env: {GIT_AUTHOR_NAME: "Bot"}
                config: {nested: {list: [1, 2]}}
                resources: {memory: "1g", cpus: 0.5, pids: 100}
                network: "none"
                pull: "never"
                user: "1000:1000"
                security: {no_new_privileges: false, cap_add: ["CHOWN"], read_only_rootfs: true}
            """
        ),
        source="suite.yaml",
    )
    assert result.issues == []
    assert result.suite is not None
    git = result.suite.mcp_services["git"]
    assert git.idle_timeout_seconds == 330
    assert git.resources.memory_bytes == 1024**3
    assert git.command == ["--repository", "/workspace"]
    assert git.security.cap_add == ["CHOWN"]
    assert result.suite.orchestrator.max_message_bytes == 4 * 1024**2


def test_an_agent_works_on_an_isolated_copy_and_a_tool_server_on_the_project_unless_told() -> None:
    result = check_suite_text(
        textwrap.dedent(
            """\
            version: "1.0"
            orchestrator:
              allowed_mount_roots: ["/srv/projects"]
              workspaces: {max_size: "512m", max_files: 5000, spare: false, spare_max_size: 64m}
            mcp_services:
              reviewer: {image: "agent:1", service_type: llm_agent}
              pair: {image: "agent:1", service_type: llm_agent, workspace: shared}
              resident:
                {image: "agent:1", service_type: llm_agent, container_strategy: reuse_per_session}
              git: {image: "git:1"}
              formatter: {image: "fmt:1", container_strategy: fresh_per_call, workspace: isolated}
            """
        ),
        source="suite.yaml",
    )
    assert result.issues == []
    assert result.suite is not None
    modes = {name: s.workspace_mode for name, s in result.suite.mcp_services.items()}
    assert modes == {
        "reviewer": "isolated",
        "pair": "shared",
        "resident": "shared",  # (a copy per task needs a container per task)
        "git": "shared",
        "formatter": "isolated",
    }
    workspaces = result.suite.orchestrator.workspaces
    assert (workspaces.max_size_bytes, workspaces.max_files) == (512 * 1024**2, 5000)
    assert (workspaces.spare, workspaces.spare_max_size_bytes) == (False, 64 * 1024**2)


# Each bad suite: the text, then (line, key path, words the message must contain) of every
# problem reported, in order.
BAD_SUITES: dict[str, tuple[str, list[tuple[int, str, str]]]] = {
    "unquoted version is a number": (
        "version: 1.0\norchestrator: {allowed_mount_roots: []}\nmcp_services: {t: {image: x}}\n",
        [(1, "version", "quote it")],
    ),
    "unknown version": (
        'version: "2.0"\norchestrator: {allowed_mount_roots: []}\nmcp_services: {t: {image: x}}\n',
        [(1, "version", "'2.0' is not one of '1.0'")],
    ),
    "missing mcp_services": (
        'version: "1.0"\norchestrator: {allowed_mount_roots: []}\n',
        [(1, "(top level)", "missing required key 'mcp_services'")],
    ),
    "no services at all": (
        'version: "1.0"\norchestrator: {allowed_mount_roots: []}\nmcp_services: {}\n',
        [(3, "mcp_services", "at least one service")],
    ),
    "service without image": (
        MINIMAL + "  git:\n    timeout: 1m\n",
        [(7, "mcp_services.git", "missing required key 'image'")],
    ),
    "misspelt service key": (
        MINIMAL + "    timout: 5m\n",
        [(7, "mcp_services.time.timout", "unknown key 'timout'; did you mean 'timeout'?")],
    ),
    "unknown top-level key": (
        MINIMAL + "services: {}\n",
        [(7, "services", "unknown key 'services'")],
    ),
    "unknown orchestrator key": (
        MINIMAL.replace('["/home/"]', '["/home/"]\n  port: 80'),
        [(4, "orchestrator.port", "unknown key 'port'")],
    ),
    "duplicate service": (
        MINIMAL + "  time:\n    image: other\n",
        [(7, "mcp_services.time", "duplicate key 'time' (first defined on line 5)")],
    ),
    "duplicate key inside a service": (
        MINIMAL + "    image: other\n",
        [(7, "mcp_services.time.image", "duplicate key 'image'")],
    ),
    "zero timeout": (
        MINIMAL + '    timeout: "0s"\n',
        [(7, "mcp_services.time.timeout", "must be a positive duration")],
    ),
    "timeout without unit": (
        MINIMAL + '    timeout: "90"\n',
        [(7, "mcp_services.time.timeout", "is not a duration")],
    ),
    "timeout with an unknown unit": (
        MINIMAL + '    timeout: "1d"\n',
        [(7, "mcp_services.time.timeout", "is not a duration")],
    ),
    "timeout as a bare number": (
        MINIMAL + "    timeout: 60\n",
        [(7, "mcp_services.time.timeout", "expected a string, got an integer")],
    ),
    "relative mount root": (
        MINIMAL.replace('["/home/"]', '["/home/", "projects"]'),
        [(3, "orchestrator.allowed_mount_roots[1]", "'projects' is not an absolute path")],
    ),
    "the file-system root as a mount root": (
        MINIMAL.replace('["/home/"]', '["/"]'),
        [(3, "orchestrator.allowed_mount_roots[0]", "would allow every host path")],
    ),
    "mount root with ..": (
        MINIMAL.replace('["/home/"]', '["/home/../etc"]'),
        [(3, "orchestrator.allowed_mount_roots[0]", "'..'")],
    ),
    "mount roots not a list": (
        MINIMAL.replace('["/home/"]', '"/home/"'),
        [(3, "orchestrator.allowed_mount_roots", "expected a list, got a string")],
    ),
    "service name with capitals": (
        MINIMAL.replace("  time:", "  Time:"),
        [(5, "mcp_services.Time", "used in URLs and container names")],
    ),
    "service name with a slash": (
        MINIMAL.replace("  time:", '  "a/b":'),
        [(5, "mcp_services.a/b", "is not allowed")],
    ),
    "memory limit too small": (
        MINIMAL + '    resources: {memory: "1k"}\n',
        [(7, "mcp_services.time.resources.memory", "too small")],
    ),
    "memory limit not a size": (
        MINIMAL + '    resources: {memory: "lots"}\n',
        [(7, "mcp_services.time.resources.memory", "is not a size")],
    ),
    "an unbounded temporary directory": (
        MINIMAL + "    security: {tmp_size: 0}\n",
        [(7, "mcp_services.time.security.tmp_size", "must be a positive size")],
    ),
    "temporary directory not a size": (
        MINIMAL + '    security: {tmp_size: "big"}\n',
        [(7, "mcp_services.time.security.tmp_size", "is not a size")],
    ),
    "zero cpus": (
        MINIMAL + "    resources: {cpus: 0}\n",
        [(7, "mcp_services.time.resources.cpus", "0")],
    ),
    "unknown pull policy": (
        MINIMAL + "    pull: sometimes\n",
        [(7, "mcp_services.time.pull", "'sometimes' is not one of 'never', 'missing', 'always'")],
    ),
    "command as a string": (
        MINIMAL + '    command: "mcp-server-time --local-timezone UTC"\n',
        [(7, "mcp_services.time.command", "expected a list or null, got a string")],
    ),
    "env value that is a number": (
        MINIMAL + "    env: {PORT: 8080}\n",
        [(7, "mcp_services.time.env.PORT", "expected a string, got an integer")],
    ),
    "reserved env variable": (
        MINIMAL + '    env: {REACTOR_FABRIC_SERVICE_CONFIG: "{}"}\n',
        [(7, "mcp_services.time.env.REACTOR_FABRIC_SERVICE_CONFIG", "is reserved")],
    ),
    "the isolation mark in env (taking gVisor away, or asking for it behind our back)": (
        MINIMAL + "    env: {REACTOR_FABRIC_ISOLATION: runc}\n",
        [(7, "mcp_services.time.env.REACTOR_FABRIC_ISOLATION", "set it with `isolation`")],
    ),
    "config that is a list": (
        MINIMAL + "    config: [a, b]\n",
        [(7, "mcp_services.time.config", "expected a mapping, got a list")],
    ),
    "origin with a path": (
        MINIMAL.replace('["/home/"]', '["/home/"]\n  allowed_origins: ["https://x.org/app"]'),
        [(4, "orchestrator.allowed_origins[0]", "is not an origin")],
    ),
    "max_sessions zero": (
        MINIMAL.replace('["/home/"]', '["/home/"]\n  max_sessions: 0'),
        [(4, "orchestrator.max_sessions", "0 is less than the minimum of 1")],
    ),
    "non-string key": (
        MINIMAL + "    env: {1: a}\n",
        [(7, "mcp_services.time.env", "key '1' must be a string")],
    ),
    "YAML merge key": (
        MINIMAL + "    <<: {timeout: 1m}\n",
        [(7, "mcp_services.time", "merge keys")],
    ),
    "broken YAML": (
        MINIMAL + "    timeout: [1m\n",
        [(8, "(top level)", "YAML syntax error")],
    ),
    "smart_refresh without any bound": (
        MINIMAL + "    container_strategy: smart_refresh\n",
        [(7, "mcp_services.time.container_strategy", "needs at least one of")],
    ),
    "a refresh bound under a tool service's default strategy": (
        MINIMAL + "    max_calls_per_container: 5\n",
        [
            (
                7,
                "mcp_services.time.max_calls_per_container",
                "only read with container_strategy: smart_refresh, and this service's strategy "
                "is reuse_per_session, the default for service_type tool_service; set "
                "container_strategy: smart_refresh, or remove max_calls_per_container",
            )
        ],
    ),
    "a refresh bound under an agent's default strategy": (
        MINIMAL + "    service_type: llm_agent\n    max_container_age: 10m\n",
        [(8, "mcp_services.time.max_container_age", "fresh_per_call, the default for")],
    ),
    "a refresh bound under an explicit fresh_per_call": (
        MINIMAL + "    container_strategy: fresh_per_call\n    memory_threshold: 100m\n",
        [(8, "mcp_services.time.memory_threshold", "strategy is fresh_per_call;")],
    ),
    "an isolated workspace under a tool service's default strategy": (
        MINIMAL + "    workspace: isolated\n",
        [
            (
                7,
                "mcp_services.time.workspace",
                "isolated needs container_strategy: fresh_per_call (a copy of the project per "
                "call), and this service's strategy is reuse_per_session, the default for "
                "service_type tool_service; set container_strategy: fresh_per_call, or "
                "workspace: shared",
            )
        ],
    ),
    "an isolated workspace under an agent's smart_refresh": (
        MINIMAL
        + "    service_type: llm_agent\n    workspace: isolated\n"
        + "    container_strategy: smart_refresh\n    max_calls_per_container: 3\n",
        [(8, "mcp_services.time.workspace", "strategy is smart_refresh; set")],
    ),
    "a workspace mode that does not exist": (
        MINIMAL + "    workspace: private\n",
        [(7, "mcp_services.time.workspace", "'private' is not one of")],
    ),
    "a workspace bound below a mebibyte": (
        MINIMAL.replace('["/home/"]', '["/home/"]\n  workspaces: {max_size: 64k}'),
        [(4, "orchestrator.workspaces.max_size", "too small")],
    ),
    "a spare copy's bound that is not a size": (
        MINIMAL.replace('["/home/"]', '["/home/"]\n  workspaces: {spare_max_size: plenty}'),
        [(4, "orchestrator.workspaces.spare_max_size", "'plenty' does not match")],
    ),
    "memory threshold not a size": (
        MINIMAL + "    container_strategy: smart_refresh\n    memory_threshold: lots\n",
        [(8, "mcp_services.time.memory_threshold", "'lots' is not a size")],
    ),
    "memory threshold too small": (
        MINIMAL + "    container_strategy: smart_refresh\n    memory_threshold: 1k\n",
        [(8, "mcp_services.time.memory_threshold", "too small")],
    ),
    "memory threshold at the memory limit": (
        MINIMAL + "    container_strategy: smart_refresh\n    memory_threshold: 512MB\n",
        [(8, "mcp_services.time.memory_threshold", "is not below the memory limit ('512m'")],
    ),
    "memory threshold above a set memory limit": (
        MINIMAL
        + "    container_strategy: smart_refresh\n    memory_threshold: 2g\n"
        + "    resources: {memory: 1g}\n",
        [(8, "mcp_services.time.memory_threshold", "is not below the memory limit ('1g'")],
    ),
    "max container age without a unit": (
        MINIMAL + '    container_strategy: smart_refresh\n    max_container_age: "45"\n',
        [(8, "mcp_services.time.max_container_age", "'45' is not a duration")],
    ),
    "zero max container age": (
        MINIMAL + '    container_strategy: smart_refresh\n    max_container_age: "0s"\n',
        [(8, "mcp_services.time.max_container_age", "must be a positive duration")],
    ),
    "more than 1000 calls per container": (
        MINIMAL + "    container_strategy: smart_refresh\n    max_calls_per_container: 1001\n",
        [(8, "mcp_services.time.max_calls_per_container", "maximum of 1000")],
    ),
    "unknown container strategy": (
        MINIMAL + "    container_strategy: per_call\n    max_calls_per_container: 5\n",
        [(7, "mcp_services.time.container_strategy", "'per_call' is not one of")],
    ),
    "unknown service type": (
        MINIMAL + "    service_type: agent\n",
        [(7, "mcp_services.time.service_type", "'agent' is not one of")],
    ),
    "misspelt lifecycle key": (
        MINIMAL + "    container_strategy: smart_refresh\n    max_calls_per_containr: 5\n",
        [
            (7, "mcp_services.time.container_strategy", "needs at least one of"),
            (
                8,
                "mcp_services.time.max_calls_per_containr",
                "unknown key 'max_calls_per_containr'; did you mean 'max_calls_per_container'?",
            ),
        ],
    ),
    "a list instead of a mapping": (
        "- version: '1.0'\n",
        [(1, "(top level)", "expected a mapping, got a list")],
    ),
    "an empty file": (
        "",
        [(1, "(top level)", "the file is empty")],
    ),
}


@pytest.mark.parametrize(
    ("text", "expected"), list(BAD_SUITES.values()), ids=list(BAD_SUITES.keys())
)
def test_each_bad_suite_is_rejected_with_a_line_numbered_error(
    text: str, expected: list[tuple[int, str, str]]
) -> None:
    result = check_suite_text(text, source="suite.yaml")
    assert result.suite is None
    got = [(issue.line, issue.path, issue.message) for issue in result.issues]
    assert len(got) == len(expected), got
    for (line, path, message), (want_line, want_path, words) in zip(got, expected, strict=True):
        assert (line, path) == (want_line, want_path), got
        assert words in message, message


def test_the_bad_suite_table_covers_at_least_twenty_mistakes() -> None:
    assert len(BAD_SUITES) >= 20


def test_every_problem_of_a_file_is_reported_not_just_the_first() -> None:
    issues = check(
        """\
        version: 1
        orchestrator:
          allowed_mount_roots: ["rel"]
        mcp_services:
          a:
            image: x
            timeout: "0s"
          B:
            image: y
        """
    )
    assert [issue.split(": ")[0] for issue in issues] == [
        "suite.yaml:1:10",
        "suite.yaml:3:25",
        "suite.yaml:7:14",
        "suite.yaml:8:3",
    ]


def test_an_error_names_the_file_line_column_and_key_path() -> None:
    [issue] = check(MINIMAL + '    timeout: "0s"\n')
    assert issue == "suite.yaml:7:14: mcp_services.time.timeout: '0s' must be a positive duration"


def test_load_suite_raises_invalid_suite_configuration_with_every_issue(tmp_path: Path) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(MINIMAL + '    timeout: "0s"\n    pull: often\n')
    with pytest.raises(InvalidSuiteConfiguration) as caught:
        load_suite(path)
    error = caught.value.to_jsonrpc_error()
    assert error["code"] == -32003
    assert error["data"]["reason"] == "invalid_suite_configuration"
    assert len(error["data"]["issues"]) == 2
    assert all(
        issue.startswith(f"{path}:7:") or f"{path}:8:" in issue for issue in error["data"]["issues"]
    )


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: p, "no such file"),
        (lambda p: (p.mkdir(), p)[1], "is a directory"),
        (lambda p: (p.write_bytes(b"version: \xff\xfe"), p)[1], "not UTF-8"),
    ],
    ids=["missing", "directory", "not-utf8"],
)
def test_an_unreadable_suite_file_raises_suite_unreadable(
    tmp_path: Path, make: object, words: str
) -> None:
    path = make(tmp_path / "suite.yaml")  # type: ignore[operator]
    with pytest.raises(SuiteUnreadable, match=words):
        load_suite(path)


def test_key_paths_are_printed_with_dots_and_list_indices() -> None:
    assert format_path(("mcp_services", "git", "command", 0)) == "mcp_services.git.command[0]"
    assert format_path(()) == "(top level)"


def test_the_bundled_suite_uses_the_image_versions_pinned_in_images_versions_env() -> None:
    pins = dict(
        line.split("=", 1)
        for line in (REPO / "images" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#") and "=" in line
    )
    suite = load_suite(REPO / "claude-mcp-suite.yaml")
    for service in ("time", "git", "filesystem", "everything"):
        version = pins[f"MCP_SERVER_{service.upper()}_VERSION"]
        expected = f"{pins['IMAGE_PREFIX']}/mcp-server-{service}:{version}"
        assert suite.mcp_services[service].image == expected


def test_fabric_is_a_reserved_service_name() -> None:
    [problem] = check(MINIMAL.replace("  time:", "  fabric:"))
    assert "name 'fabric' is reserved" in problem
    assert "suite-level endpoint" in problem


def test_profiles_and_discovery_fields_load_and_a_profile_naming_no_service_is_refused() -> None:
    described = MINIMAL.replace(
        '    image: "reactor-fabric/mcp-server-time:2026.10.19"\n',
        '    image: "reactor-fabric/mcp-server-time:2026.10.19"\n'
        "    categories: [time]\n"
        "    keywords: [clock, timezone]\n"
        '    example_tasks: ["What time is it in Tokyo?"]\n',
    ).replace("  allowed_mount_roots", "  fabric: {default_exposure: all}\n  allowed_mount_roots")
    good = described + "profiles:\n  clock:\n    services: [time]\n"
    result = check_suite_text(good, source="suite.yaml")
    assert result.issues == []
    assert result.suite is not None
    assert result.suite.profiles["clock"].services == ["time"]
    assert result.suite.orchestrator.fabric.default_exposure == "all"
    assert result.suite.mcp_services["time"].keywords == ["clock", "timezone"]
    [problem] = check(described + "profiles:\n  web:\n    services: [time, git]\n")
    assert problem.startswith("suite.yaml:13:22: profiles.web.services[1]")
    assert "no service named 'git' in mcp_services (time)" in problem
    [exposure] = check(described.replace("default_exposure: all", "default_exposure: some"))
    assert "default_exposure" in exposure


def test_a_service_name_holding_the_tool_separator_is_refused_with_the_reason() -> None:
    # Service 'a' with a tool 'b__c' and service 'a__b' with a tool 'c' would both be shown as
    # 'a__b__c' on the fabric endpoint: one of them silently dropped.
    [problem] = check(MINIMAL.replace("  time:", "  time__zone:"))
    assert "name 'time__zone' is not allowed" in problem
    assert "separates a service from its tool" in problem
    assert "'time'" in problem
    assert check(MINIMAL.replace("  time:", "  time_zone:")) == []


REFERENCE_SUITE = REPO / "tests" / "unit" / "data" / "reference-advanced-mcp-suite.yaml"


def test_the_reference_designs_example_suite_validates_with_only_its_image_names_changed() -> None:
    # Its mount roots end in '/' ("/home/"), its version is "1.0", and it uses every lifecycle
    # field: users bring suite files written for the reference design.
    suite = load_suite(REFERENCE_SUITE)
    services = suite.mcp_services
    assert suite.orchestrator.allowed_mount_roots == [
        "/home/",
        "/Users/",
        "/tmp/",
        "/opt/workspace/",
    ]
    assert {name: service.strategy for name, service in services.items()} == {
        "filesystem": "reuse_per_session",
        "postgres_tools": "smart_refresh",
        "secure_shell": "fresh_per_call",
        "git_advanced": "smart_refresh",
        # The reference takes it for an agent by its image's name; here an agent says so
        # (service_type: llm_agent), so this one is a tool service, reused per session.
        "python_expert": "reuse_per_session",
        "react_specialist": "smart_refresh",
        "devops_expert": "reuse_per_session",
        "security_analyst": "fresh_per_call",
        "code_reviewer": "smart_refresh",
        "api_tester": "reuse_per_session",
        "docs_generator": "fresh_per_call",
    }
    postgres = services["postgres_tools"]
    assert postgres.max_calls_per_container == 25
    assert postgres.max_container_age_seconds == 45 * 60
    assert postgres.memory_threshold_bytes == 200 * 1024**2  # binary units, as Docker reads them
    assert services["git_advanced"].memory_threshold_bytes is None
    assert services["react_specialist"].service_type == "llm_agent"
    assert services["react_specialist"].max_container_age_seconds == 12 * 60


def test_a_key_the_suite_does_not_know_in_the_reference_suite_is_refused_at_its_line() -> None:
    text = REFERENCE_SUITE.read_text()
    lines = text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "max_calls_per_container: 25" in line)
    lines.insert(at + 1, "    auto_detect_type: true\n")
    [problem] = check("".join(lines))
    assert problem.startswith(
        f"suite.yaml:{at + 2}:5: mcp_services.postgres_tools.auto_detect_type:"
    )
    assert "unknown key 'auto_detect_type'" in problem


def with_orchestrator(lines: str) -> str:
    """MINIMAL with ``lines`` (YAML, two spaces in) added to its orchestrator."""
    return MINIMAL.replace('["/home/"]', '["/home/"]\n' + textwrap.indent(lines, "  "))


def test_auth_is_a_word_or_a_sign_in_and_each_mistake_says_what_to_write() -> None:
    for good in (
        "auth: token",
        "auth: none",
        "auth: {mode: token}",
        'auth: {mode: oidc, issuer: "https://login.example.com/realms/a"}',
        'auth: {mode: oidc, issuer: "http://127.0.0.1:3000", leeway: 5m}',
    ):
        assert check(with_orchestrator(good)) == [], good
    for bad, words in (
        ("auth: oidc", "'oidc' is not one of 'token', 'none' (sign-in with an OpenID provider"),
        ("auth: {mode: oidc}", "orchestrator.auth: 'issuer' is a required property"),
        ('auth: {mode: oidc, issuer: "http://idp.example.com"}', "an issuer is https, or http"),
        ('auth: {mode: oidc, issuer: "https://i", leeway: 6m}', "is longer than 300s"),
        ('auth: {mode: oidc, issuer: "https://i", algorithms: [HS256]}', "algorithms.0: 'HS256'"),
        ('auth: {mode: oidc, issuer: "https://i?x=1"}', "issuer: 'https://i?x=1' is not a URL"),
    ):
        said = check(with_orchestrator(bad))
        assert len(said) == 1, (bad, said)
        assert words in said[0], (bad, said)


def test_user_entries_name_services_accounts_and_roots_the_suite_can_have() -> None:
    good = """\
    users:
      default: {allowed_mount_roots: ["/home/{user}/"], services: [time], max_sessions: 2}
      "group:ops": {calls_per_minute: 600}
      alice: {services: null}
    """
    assert check(with_orchestrator(textwrap.dedent(good))) == []
    for bad, words in (
        ("users: {default: {services: [nope]}}", "no service in mcp_services is named 'nope'"),
        ("users: {alice: {accounts: [team]}}", "no account in orchestrator.accounts is named"),
        ('users: {"group:": {max_sessions: 1}}', "a group entry names its group"),
        ('users: {default: {allowed_mount_roots: ["/"]}}', "'/' cannot be a mount root"),
        ('users: {default: {allowed_mount_roots: ["/home/{user}/../x"]}}', "'..' components"),
        ("users: {bob: {max_sessions: 0}}", "max_sessions"),
        ("users: {bob: {colour: red}}", "colour"),
    ):
        said = check(with_orchestrator(bad))
        assert len(said) == 1, (bad, said)
        assert words in said[0], (bad, said)
