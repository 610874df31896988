"""Agent services' model accounts (``orchestrator.accounts``, an agent's ``config.account``),
their default egress, and ``uses``: the suite's form, resolution, the container each agent
gets, and what a client sees of an agent that cannot run."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from reactor_fabric import check_suite_text
from reactor_fabric._cli import main
from reactor_fabric.config.secrets import resolve_suite_secrets
from reactor_fabric.config.structs import Account, SecretSource, Service, Suite
from reactor_fabric.observe.observer import Observer
from reactor_fabric.policy.container_parts.egress import EgressPart
from reactor_fabric.policy.container_parts.ownership import LABEL_SERVICE, ContainerIdentity
from reactor_fabric.policy.container_spec import container_spec_for
from reactor_fabric.runtime.memory import open_memory_runtime
from reactor_fabric.trio.catalog import CatalogStore
from reactor_fabric.trio.serve import assemble
from tests.fakes import EVERY_CAPABILITY, scripted_mcp_server
from tests.served import served, suite_for

WORK_KEY = "sk-ant-work-never-shown-0001"
HOME_KEY = "sk-ant-home-never-shown-0002"

SUITE = """\
version: "1.0"
orchestrator:
  allowed_mount_roots: ["/tmp/"]
  accounts:
    work:
      description: "the company's"
      secrets:
        ANTHROPIC_API_KEY: {{env: WORK_KEY, as: env}}
    personal:
      secrets:
        ANTHROPIC_API_KEY: {{env: HOME_KEY, as: env}}
mcp_services:
  git:
    image: "reactor-fabric/mcp-server-git:2026.10.19"
    config: {{account: "not an account: a tool server's config is its own"}}
  reviewer:
    image: "reactor-fabric/agent-claude-code:2.1.332"
    service_type: llm_agent
    uses: [git]
    config: {{account: work, specialty: "reviews"}}
  writer:
    image: "reactor-fabric/agent-claude-code:2.1.332"
    service_type: llm_agent
    config: {{account: personal}}
{extra}"""


def check(extra: str = "") -> tuple[Suite | None, list[str], list[str]]:
    text = SUITE.format(extra=textwrap.indent(textwrap.dedent(extra), "  "))
    result = check_suite_text(text, source="suite.yaml")
    return result.suite, [str(i) for i in result.issues], [str(w) for w in result.warnings]


def valid(extra: str = "") -> Suite:
    suite, issues, _ = check(extra)
    assert issues == []
    assert suite is not None
    return suite


# --- the suite's form ------------------------------------------------------------------------


def test_accounts_are_read_and_an_agent_names_one_while_a_tool_servers_config_is_its_own() -> None:
    suite = valid()
    assert suite.orchestrator.accounts["work"] == Account(
        description="the company's",
        secrets={"ANTHROPIC_API_KEY": SecretSource(env="WORK_KEY", as_="env")},
    )
    services = suite.mcp_services
    assert (services["reviewer"].account, services["writer"].account) == ("work", "personal")
    assert services["git"].account is None  # passed through untouched, never resolved
    assert services["reviewer"].uses == ["git"]


def test_an_agent_naming_an_undefined_account_is_valid_with_a_warning_at_its_line() -> None:
    suite, issues, warnings = check(
        """\
        security:
          image: "reactor-fabric/agent-claude-code:2.1.332"
          service_type: llm_agent
          config: {account: audit}
        """
    )
    assert issues == []
    assert suite is not None
    [warning] = warnings
    assert warning.startswith("suite.yaml:28:23:")
    assert "mcp_services.security.config.account" in warning
    assert "account 'audit' is not defined under orchestrator.accounts (personal, work)" in warning
    assert "security will be unavailable (account_unavailable)" in warning


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            'x:\n  image: "a"\n  service_type: llm_agent\n  config: {account: work}\n'
            "  secrets: {ANTHROPIC_API_KEY: {env: OTHER}}\n",
            "mcp_services.x.secrets.ANTHROPIC_API_KEY: 'ANTHROPIC_API_KEY' is also a secret of "
            "account 'work'",
        ),
        (
            'x:\n  image: "a"\n  service_type: llm_agent\n  config: {account: work}\n'
            '  env: {ANTHROPIC_API_KEY: "sk"}\n',
            "mcp_services.x.env.ANTHROPIC_API_KEY: 'ANTHROPIC_API_KEY' is a secret of account",
        ),
        (
            'x:\n  image: "a"\n  service_type: llm_agent\n  config: {account: 7}\n',
            "mcp_services.x.config.account: an agent's account is the name of one of",
        ),
        ('x:\n  image: "a"\n  uses: [git]\n', "only an agent (service_type: llm_agent) uses"),
        (
            'x:\n  image: "a"\n  service_type: llm_agent\n  uses: [gti]\n',
            "mcp_services.x.uses[0]: no service named 'gti' in mcp_services",
        ),
        (
            'x:\n  image: "a"\n  service_type: llm_agent\n  uses: [x]\n',
            "'x' cannot use itself",
        ),
        (
            'x:\n  image: "a"\n  service_type: llm_agent\n  security: {git_writable: true}\n',
            "mcp_services.x.security.git_writable: an agent never gets the project's .git writable",
        ),
    ],
)
def test_an_agents_account_or_uses_that_cannot_work_is_reported_at_its_key(
    extra: str, expected: str
) -> None:
    _, issues, _ = check(extra)
    assert len(issues) == 1
    assert expected in issues[0]


def test_an_account_without_secrets_or_with_a_bad_name_is_refused_by_the_schema() -> None:
    text = SUITE.format(extra="").replace("    personal:\n", "    'bad name':\n")
    issues = [str(i) for i in check_suite_text(text, source="s.yaml").issues]
    assert any("orchestrator.accounts.bad name" in issue for issue in issues)
    text = SUITE.format(extra="").replace(
        "    personal:\n      secrets:\n        ANTHROPIC_API_KEY: {env: HOME_KEY, as: env}\n",
        "    personal: {secrets: {}}\n",
    )
    issues = [str(i) for i in check_suite_text(text, source="s.yaml").issues]
    assert any("orchestrator.accounts.personal.secrets" in issue for issue in issues)


def test_validate_config_warns_of_an_undefined_account_and_exits_0_even_with_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "suite.yaml"
    extra = (
        '  security:\n    image: "a"\n    service_type: llm_agent\n    config: {account: audit}\n'
    )
    path.write_text(SUITE.format(extra=extra))
    monkeypatch.setenv("WORK_KEY", WORK_KEY)
    monkeypatch.setenv("HOME_KEY", HOME_KEY)
    assert main(["validate-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "valid (4 service(s)" in out
    assert "account 'audit' is not defined" in err
    assert "(warning)" in err
    assert main(["validate-config", "--secrets", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "service reviewer: secrets resolve (ANTHROPIC_API_KEY)" in out
    assert WORK_KEY not in out + err
    assert HOME_KEY not in out + err


# --- resolution: each agent its own account's credentials ------------------------------------


def test_two_accounts_agents_each_get_only_their_own_accounts_key() -> None:
    suite = valid()
    resolved = resolve_suite_secrets(suite, environ={"WORK_KEY": WORK_KEY, "HOME_KEY": HOME_KEY})
    assert set(resolved) == {"reviewer", "writer"}  # git names no account: nothing resolved
    assert resolved["reviewer"].values() == [WORK_KEY]
    assert resolved["writer"].values() == [HOME_KEY]
    assert WORK_KEY not in repr(resolved)


def test_an_agents_own_secrets_come_after_its_accounts() -> None:
    suite = valid()
    reviewer = msgspec.structs.replace(
        suite.mcp_services["reviewer"], secrets={"GITHUB_TOKEN": SecretSource(env="GH")}
    )
    suite = msgspec.structs.replace(suite, mcp_services={"reviewer": reviewer})
    [(_name, secrets)] = resolve_suite_secrets(
        suite, environ={"WORK_KEY": WORK_KEY, "GH": "ghp_xxxx"}
    ).items()
    assert [secret.name for secret in secrets.secrets] == ["ANTHROPIC_API_KEY", "GITHUB_TOKEN"]


def test_an_undefined_account_refuses_its_agent_with_account_unavailable_and_a_missing_key_names_the_account() -> (  # noqa: E501
    None
):
    suite = valid()
    stranger = Service(image="a", service_type="llm_agent", config={"account": "audit"})
    suite = msgspec.structs.replace(
        suite, mcp_services={**suite.mcp_services, "stranger": stranger}
    )
    resolved = resolve_suite_secrets(suite, environ={"HOME_KEY": HOME_KEY})
    assert resolved["stranger"].problems == (
        "account 'audit' is not defined under orchestrator.accounts",
    )
    assert resolved["stranger"].reason == "account_unavailable"
    assert resolved["reviewer"].problems == (
        "account work's secret ANTHROPIC_API_KEY: the variable WORK_KEY is not set in the "
        "orchestrator's environment",
    )
    assert resolved["reviewer"].reason == "secret_unavailable"
    assert resolved["writer"].available


# --- the container an agent gets -------------------------------------------------------------


def identity_with(suite: Suite, environ: dict[str, str]) -> ContainerIdentity:
    return ContainerIdentity(
        instance_id="inst",
        owner_host="host",
        owner_pid=1,
        owner_start="0",
        default_network="bridge",
        secrets=resolve_suite_secrets(suite, environ=environ),
    )


def test_an_agent_without_egress_or_network_reaches_the_model_api_only_and_gets_its_key() -> None:
    suite = valid()
    identity = identity_with(suite, {"WORK_KEY": WORK_KEY, "HOME_KEY": HOME_KEY})
    spec = container_spec_for(
        "reviewer",
        suite.mcp_services["reviewer"],
        session_id="s1",
        identity=identity,
        capabilities=EVERY_CAPABILITY,
    )
    assert spec.network == "none"
    assert spec.egress == EgressPart(("api.anthropic.com:443",))
    assert spec.environment["HTTPS_PROXY"].startswith("http://127.0.0.1:")
    assert spec.environment["ANTHROPIC_API_KEY"] == WORK_KEY
    assert HOME_KEY not in json.dumps(spec.environment)
    config = json.loads(spec.environment["REACTOR_FABRIC_SERVICE_CONFIG"])
    assert config == {"account": "work", "specialty": "reviews"}
    writer = container_spec_for(
        "writer",
        suite.mcp_services["writer"],
        session_id="s1",
        identity=identity,
        capabilities=EVERY_CAPABILITY,
    )
    assert writer.environment["ANTHROPIC_API_KEY"] == HOME_KEY
    assert WORK_KEY not in json.dumps(writer.environment)
    # A tool server keeps its network, and its config.account means nothing to us.
    git = container_spec_for(
        "git",
        suite.mcp_services["git"],
        session_id="s1",
        identity=identity,
        capabilities=EVERY_CAPABILITY,
    )
    assert (git.network, git.egress) == ("bridge", None)
    assert "ANTHROPIC_API_KEY" not in git.environment


def test_an_agents_own_egress_or_network_wins_over_the_default() -> None:
    agent = Service(image="a", service_type="llm_agent")
    assert agent.egress_in_force == ["api.anthropic.com:443"]
    gateway = msgspec.structs.replace(agent, egress=["llm-gateway.internal:8443"])
    assert gateway.egress_in_force == ["llm-gateway.internal:8443"]
    assert msgspec.structs.replace(agent, egress=[]).egress_in_force == []
    assert msgspec.structs.replace(agent, network="bridge").egress_in_force is None
    assert Service(image="a").egress_in_force is None


# --- what a client sees ----------------------------------------------------------------------


async def test_an_agent_with_an_undefined_account_is_unavailable_with_the_reason_the_rest_serve(
    tmp_path: Path,
) -> None:
    services = {
        "agent": Service(image="fake/agent:1", service_type="llm_agent", config={"account": "x"}),
        "beta": Service(image="fake/beta:1"),
    }
    async with served(tmp_path, learn_catalog=True, services=services) as http:
        ws, _ = await http.websocket("/mcp")
        await ws.send_json(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {}},
            }
        )
        await ws.hear()
        await ws.send_json({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await ws.send_json(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "get_status", "arguments": {}},
            }
        )
        status = (await ws.hear())["result"]["structuredContent"]
        unavailable = status["unavailable"]["agent"]
        assert unavailable["reason"] == "account_unavailable"
        assert "account 'x' is not defined" in unavailable["detail"]
        await ws.send_json(
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "agent__run_task", "arguments": {"task": "t"}},
            }
        )
        failed = await ws.hear()
        assert failed["error"]["code"] == -32002
        assert failed["error"]["data"]["reason"] == "account_unavailable"
        await ws.send_json(
            {
                "jsonrpc": "2.0",
                "id": 4,
                "method": "tools/call",
                "params": {"name": "beta__echo", "arguments": {}},
            }
        )
        assert "result" in await ws.hear()
        assert {spec.labels[LABEL_SERVICE] for spec in http.runtime.spawned} == {"beta"}
        await ws.aclose()


async def test_an_agent_whose_key_went_missing_is_unavailable_even_with_its_offer_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CatalogStore(tmp_path / "catalog")
    accounts = {"work": Account(secrets={"ANTHROPIC_API_KEY": SecretSource(env="RF_T_WORK")})}
    suite = msgspec.structs.replace(
        suite_for(tmp_path, accounts=accounts),
        mcp_services={
            "agent": Service(
                image="fake/agent:1", service_type="llm_agent", config={"account": "work"}
            )
        },
    )

    async def learned_offer() -> dict[str, Any]:
        async with open_memory_runtime(scripted_mcp_server) as runtime:
            fabric = assemble(
                suite, runtime=runtime, network="none", observer=Observer(), catalog_store=store
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(fabric.catalog.learn)
                await fabric.catalog.ready.wait()
                nursery.cancel_scope.cancel()
            return fabric.catalog.current.unavailable()

    monkeypatch.setenv("RF_T_WORK", WORK_KEY)
    assert await learned_offer() == {}  # learned, and cached
    monkeypatch.delenv("RF_T_WORK")
    unavailable = await learned_offer()
    assert unavailable["agent"]["reason"] == "secret_unavailable"


REPO = Path(__file__).resolve().parents[3]


def test_the_example_of_two_specialists_is_valid_without_a_warning() -> None:
    path = REPO / "examples" / "specialists.yaml"
    result = check_suite_text(path.read_text(), source=str(path))
    assert [str(i) for i in result.issues] == []
    assert result.warnings == []
    assert result.suite is not None
    services = result.suite.mcp_services
    agents = {n for n, s in services.items() if s.service_type == "llm_agent"}
    assert agents == {"implementer", "test_writer", "polisher", "code_reviewer", "security_analyst"}
    for name in agents:
        assert services[name].account == "work"
        assert services[name].egress_in_force == ["api.anthropic.com:443"]
    # The pipeline's steps work on copies; the reviewers, which read history, on the project.
    modes = {name: services[name].workspace_mode for name in agents}
    assert modes == {
        "implementer": "isolated",
        "test_writer": "isolated",
        "polisher": "isolated",
        "code_reviewer": "shared",
        "security_analyst": "shared",
    }


def test_the_reference_suite_loads_and_warns_only_of_its_agents_undefined_accounts() -> None:
    path = REPO / "tests" / "unit" / "data" / "reference-advanced-mcp-suite.yaml"
    result = check_suite_text(path.read_text(), source=str(path))
    assert result.issues == []
    # Its agents (service_type: llm_agent) name accounts set up elsewhere; python_expert and
    # security_analyst say no service_type: tool services here, their config their own.
    assert [w.path for w in result.warnings] == [
        "mcp_services.react_specialist.config.account",
        "mcp_services.devops_expert.config.account",
    ]


def test_the_bundled_suite_gives_its_specialist_the_default_accounts_key_only() -> None:
    path = REPO / "claude-mcp-suite.yaml"
    result = check_suite_text(path.read_text(), source=str(path))
    assert result.warnings == []
    assert result.suite is not None
    resolved = resolve_suite_secrets(result.suite, environ={"ANTHROPIC_API_KEY": WORK_KEY})
    assert set(resolved) == {"code_reviewer"}
    assert resolved["code_reviewer"].values() == [WORK_KEY]
    missing = resolve_suite_secrets(result.suite, environ={})["code_reviewer"]
    assert missing.reason == "secret_unavailable"
