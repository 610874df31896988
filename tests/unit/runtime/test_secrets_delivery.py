"""Secrets from the start to the container: the spec (environment, files, account), the
refusal of a service whose secret is missing (the others serve), the files' directory, the
Docker create's mount, and redaction (log, trail, stderr lines, an exit's details)."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import stat
from pathlib import Path

import pytest
import trio

from reactor_fabric import ContainerStartFailure
from reactor_fabric.config.secrets import SECRETS_DIR, Secret, ServiceSecrets
from reactor_fabric.config.structs import SecretSource, Service
from reactor_fabric.observe.audit import AuditWriter, read_records
from reactor_fabric.observe.logging import JsonFormatter
from reactor_fabric.observe.observer import Observer
from reactor_fabric.observe.redaction import REDACTED, SECRET_VALUES, Redactor
from reactor_fabric.policy.accounts import UNPRIVILEGED, Account
from reactor_fabric.policy.container_parts.ownership import LABEL_SERVICE, ContainerIdentity
from reactor_fabric.policy.container_spec import ContainerSpec, container_spec_for, pooled_spec_for
from reactor_fabric.runtime.docker import DockerRuntime
from reactor_fabric.runtime.kubernetes import KubernetesRuntime
from reactor_fabric.runtime.kubernetes_manifests import pod_manifest, secret_manifest, secret_name
from reactor_fabric.runtime.memory import MemoryServer
from reactor_fabric.runtime.secret_files import SecretFiles, file_system_type
from tests.fakes import EVERY_CAPABILITY, scripted_mcp_server
from tests.messages import INITIALIZE, INITIALIZED, request
from tests.served import Served, served
from tests.unit.runtime.test_kubernetes_manifests import valid

VALUE = "ghp_s3cr3t-value-never-shown"
FILE_VALUE = 'db-pa$$word"with\\quotes'
ME = Account(os.geteuid(), os.getegid(), "me")


@pytest.fixture(autouse=True)
def _forget_values() -> None:
    SECRET_VALUES.clear()


def identity(
    secrets: dict[str, ServiceSecrets], account: Account | None = None
) -> ContainerIdentity:
    return ContainerIdentity(
        instance_id="inst1",
        owner_host="host",
        owner_pid=42,
        owner_start="1",
        default_network="none",
        secrets=secrets,
        secrets_account=account,
    )


RESOLVED = ServiceSecrets(
    secrets=(
        Secret("GITHUB_TOKEN", "both", VALUE),
        Secret("ONLY_ENV", "env", VALUE + "-env"),
        Secret("DB_PASSWORD", "file", FILE_VALUE),
    )
)


def test_secrets_reach_the_environment_unless_as_file_and_a_file_unless_as_env() -> None:
    spec = container_spec_for(
        "github",
        Service(image="img"),
        session_id="s1",
        identity=identity({"github": RESOLVED}),
        capabilities=EVERY_CAPABILITY,
    )
    assert spec.environment["GITHUB_TOKEN"] == VALUE
    assert spec.environment["ONLY_ENV"] == VALUE + "-env"
    assert "DB_PASSWORD" not in spec.environment
    assert [secret.name for secret in spec.secret_files] == ["GITHUB_TOKEN", "DB_PASSWORD"]
    # (No problem with them: a spec whose secrets have one is refused as it is composed.)
    assert VALUE not in repr(spec.secret_files)
    assert FILE_VALUE not in repr(spec)


def test_a_service_without_secrets_gets_exactly_the_container_it_got_before() -> None:
    plain = container_spec_for(
        "time",
        Service(image="img"),
        session_id="s1",
        identity=identity({}),
        capabilities=EVERY_CAPABILITY,
    )
    other = container_spec_for(
        "time",
        Service(image="img"),
        session_id="s1",
        identity=identity({"github": RESOLVED}, ME),
        capabilities=EVERY_CAPABILITY,
    )
    assert plain == other
    assert plain.secret_files == ()
    assert plain.user == UNPRIVILEGED.docker_user


def test_a_server_with_file_secrets_runs_as_the_orchestrators_user_when_that_is_not_root() -> None:
    ids = identity({"github": RESOLVED}, ME)
    session = container_spec_for(
        "github", Service(image="img"), session_id="s1", identity=ids, capabilities=EVERY_CAPABILITY
    )
    pooled = pooled_spec_for(
        "github", Service(image="img"), token=1, identity=ids, capabilities=EVERY_CAPABILITY
    )
    assert session.user == pooled.user == ME.docker_user
    # The suite's user is kept: the runtime refuses the files if it cannot give them to it.
    named = container_spec_for(
        "github",
        Service(image="img", user="1234:1234"),
        session_id="s1",
        identity=ids,
        capabilities=EVERY_CAPABILITY,
    )
    assert named.user == "1234:1234"
    # Only env secrets: as readable through /proc/PID/environ by whoever shares the uid, so
    # the same account (before: the usual one, nobody's or the project's owner's).
    env_only = ServiceSecrets(secrets=(Secret("T", "env", VALUE),))
    spec = container_spec_for(
        "github",
        Service(image="img"),
        session_id="s1",
        identity=identity({"github": env_only}, ME),
        capabilities=EVERY_CAPABILITY,
    )
    assert spec.user == ME.docker_user


def test_a_root_orchestrators_server_with_secrets_runs_as_an_account_no_host_user_holds() -> None:
    secrets_owner = Account(2_000_000_000, 2_000_000_000, "reactor-fabric-secrets")
    owner = Account(1000, 1000, "ann")
    for resolved in (RESOLVED, ServiceSecrets(secrets=(Secret("T", "env", VALUE),))):
        ids = identity({"github": resolved}, secrets_owner)
        for account in (owner, UNPRIVILEGED):  # a session's mount's owner; no mount
            spec = container_spec_for(
                "github",
                Service(image="img"),
                session_id="s1",
                identity=ids,
                account=account,
                capabilities=EVERY_CAPABILITY,
            )
            assert spec.user == "2000000000:2000000000"
            assert spec.environment["USER"] == "reactor-fabric-secrets"
        # A service without secrets in the same suite runs as the session says.
        plain = container_spec_for(
            "time",
            Service(image="img"),
            session_id="s1",
            identity=ids,
            account=owner,
            capabilities=EVERY_CAPABILITY,
        )
        assert plain.user == "1000:1000"


def test_a_pooled_container_gets_the_same_secrets_as_a_sessions() -> None:
    ids = identity({"github": RESOLVED}, ME)
    session = container_spec_for(
        "github", Service(image="img"), session_id="s1", identity=ids, capabilities=EVERY_CAPABILITY
    )
    pooled = pooled_spec_for(
        "github", Service(image="img"), token=1, identity=ids, capabilities=EVERY_CAPABILITY
    )
    assert pooled.environment == session.environment
    assert pooled.secret_files == session.secret_files


def test_the_docker_create_binds_the_secret_directory_read_only_at_run_secrets(
    tmp_path: Path,
) -> None:
    runtime = DockerRuntime(base_url="unix:///nonexistent.sock", socket_stdio=False)
    runtime._secret_files = SecretFiles(parent=str(_shm()))
    spec = container_spec_for(
        "github",
        Service(image="img"),
        session_id="s1",
        identity=identity({"github": RESOLVED}, ME),
        capabilities=EVERY_CAPABILITY,
    )
    try:
        mount = runtime._secrets_mount(spec)
        assert mount["Target"] == SECRETS_DIR
        assert mount["Type"] == "bind"
        assert mount["ReadOnly"] is True
        assert Path(mount["Source"], "GITHUB_TOKEN").read_text() == VALUE
    finally:
        runtime._secret_files.close()


def _shm() -> Path:
    if file_system_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    return Path("/dev/shm")


def test_secret_files_are_memory_backed_owner_only_the_same_for_every_container_and_removed() -> (
    None
):
    files = SecretFiles(parent=str(_shm()))
    ids = identity({"github": RESOLVED}, ME)
    first = container_spec_for(
        "github", Service(image="img"), session_id="s1", identity=ids, capabilities=EVERY_CAPABILITY
    )
    pooled = pooled_spec_for(
        "github", Service(image="img"), token=7, identity=ids, capabilities=EVERY_CAPABILITY
    )
    try:
        directory = Path(files.directory_for(first))
        assert files.directory_for(pooled) == str(directory)
        assert file_system_type(str(directory)) == "tmpfs"
        assert stat.S_IMODE(directory.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(directory.stat().st_mode) == 0o500
        assert sorted(p.name for p in directory.iterdir()) == ["DB_PASSWORD", "GITHUB_TOKEN"]
        for path, value in [
            (directory / "GITHUB_TOKEN", VALUE),
            (directory / "DB_PASSWORD", FILE_VALUE),
        ]:
            info = path.stat()
            assert stat.S_IMODE(info.st_mode) == 0o400
            assert (info.st_uid, info.st_gid) == (ME.uid, ME.gid)
            assert path.read_text() == value
    finally:
        files.close()
    assert not directory.parent.exists()


def test_secret_files_are_refused_when_they_cannot_be_given_to_the_servers_user() -> None:
    if os.geteuid() == 0:
        pytest.skip("root can give a file to anyone")
    files = SecretFiles(parent=str(_shm()))
    ids = identity({"github": RESOLVED}, ME)
    for user, why in [("1234:1234", "can give a file only to its own user"), ("node", "is a name")]:
        spec = container_spec_for(
            "github",
            Service(image="img", user=user),
            session_id="s1",
            identity=ids,
            capabilities=EVERY_CAPABILITY,
        )
        with pytest.raises(ContainerStartFailure, match=why) as caught:
            files.directory_for(spec)
        assert caught.value.reason == "secret_unavailable"
    files.close()


def test_as_root_the_files_are_given_to_the_account_the_server_runs_as() -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    files = SecretFiles(parent=str(_shm()))
    spec = container_spec_for(
        "github",
        Service(image="img"),
        session_id="s1",
        identity=identity({"github": RESOLVED}),
        capabilities=EVERY_CAPABILITY,
    )
    assert spec.user == UNPRIVILEGED.docker_user
    try:
        directory = Path(files.directory_for(spec))
        for path in [directory, directory / "GITHUB_TOKEN", directory / "DB_PASSWORD"]:
            assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65534)
        assert stat.S_IMODE((directory / "GITHUB_TOKEN").stat().st_mode) == 0o400
    finally:
        files.close()
    assert not directory.parent.exists()


def test_a_directory_that_is_not_memory_backed_is_refused(tmp_path: Path) -> None:
    if file_system_type(str(tmp_path)) == "tmpfs":
        pytest.skip("the temporary directory is a tmpfs here")
    spec = container_spec_for(
        "github",
        Service(image="img"),
        session_id="s1",
        identity=identity({"github": RESOLVED}, ME),
        capabilities=EVERY_CAPABILITY,
    )
    with pytest.raises(ContainerStartFailure, match="not memory-backed"):
        SecretFiles(parent=str(tmp_path)).directory_for(spec)


# --- redaction ----------------------------------------------------------------------------


def test_a_value_is_redacted_as_it_is_and_as_json_escapes_it() -> None:
    redactor = Redactor()
    assert redactor.redact(f"x {VALUE}") == f"x {VALUE}"  # nothing registered
    redactor.register([VALUE, FILE_VALUE])
    line = json.dumps({"a": f"token={VALUE}", "b": FILE_VALUE})
    assert VALUE not in redactor.redact(line)
    assert json.dumps(FILE_VALUE)[1:-1] not in redactor.redact(line)
    assert json.loads(redactor.redact(line)) == {"a": f"token={REDACTED}", "b": REDACTED}
    assert redactor.redact_bytes(line.encode()) == redactor.redact(line).encode()


def test_a_json_value_is_redacted_in_its_strings_keys_and_numbers_and_stays_json() -> None:
    redactor = Redactor()
    redactor.register([VALUE, FILE_VALUE, "9876543"])
    clean = {"a": ["b", 1, {"c": None}]}
    assert redactor.redacted(clean) is clean  # nothing to replace: not even copied
    value = {
        "tool": f"x-{VALUE}",
        VALUE: [FILE_VALUE, 19876543, 12, True, ("t", VALUE)],
        "deep": [[[[f"{VALUE}!"]]]],
    }
    kept, data = redactor.redacted_encoded(value)
    assert kept == {
        "tool": f"x-{REDACTED}",
        REDACTED: [REDACTED, REDACTED, 12, True, ["t", REDACTED]],
        "deep": [[[[f"{REDACTED}!"]]]],
    }
    assert json.loads(data) == kept  # still JSON, where the number alone would have broken it
    assert value["tool"] == f"x-{VALUE}"  # the value given is left as it was


def test_the_log_and_the_audit_trail_never_carry_a_registered_value(tmp_path: Path) -> None:
    SECRET_VALUES.register([VALUE])
    record = logging.LogRecord("reactor_fabric.x", logging.INFO, __file__, 1, "event", (), None)
    record.detail = f"Authorization: Bearer {VALUE}"
    assert VALUE not in JsonFormatter().format(record)
    trail = tmp_path / "audit.jsonl"
    writer = AuditWriter(trail, max_bytes=1 << 20, keep=1)
    writer.open()
    writer.submit({"event": "tool_call", "arguments": {"token": VALUE}})
    writer.close()
    text = trail.read_text()
    assert REDACTED in text
    assert VALUE not in text


# --- the orchestrator: a missing secret refuses its service only; stderr redacted ----------


async def leaky_server(container: MemoryServer) -> None:
    """Prints its token on stderr (as a careless debug line would), then serves."""
    token = container.spec.environment.get("GITHUB_TOKEN", "")
    await container.write_stderr(f"debug: using token {token}\n".encode())
    await scripted_mcp_server(container)


async def open_fabric_session(http: Served) -> object:
    ws, _ = await http.websocket("/mcp")
    await ws.send_json(INITIALIZE)
    assert (await ws.hear())["result"]["serverInfo"]["name"] == "reactor-fabric"
    await ws.send_json(INITIALIZED)
    return ws


def tool_call(request_id: int, name: str) -> dict[str, object]:
    return request(request_id, "tools/call", {"name": name, "arguments": {}})


async def test_a_service_whose_secret_is_missing_answers_secret_unavailable_and_the_others_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RF_TEST_GITHUB_TOKEN", raising=False)
    services = {
        "github": Service(
            image="fake/github:1",
            secrets={"GITHUB_TOKEN": SecretSource(env="RF_TEST_GITHUB_TOKEN")},
        ),
        "beta": Service(image="fake/beta:1"),
    }
    async with served(tmp_path, learn_catalog=True, services=services) as http:
        ws = await open_fabric_session(http)
        await ws.send_json(tool_call(2, "github__echo"))  # type: ignore[attr-defined]
        failed = await ws.hear()  # type: ignore[attr-defined]
        assert failed["error"]["code"] == -32002
        assert failed["error"]["data"]["reason"] == "secret_unavailable"
        assert "RF_TEST_GITHUB_TOKEN is not set" in failed["error"]["message"]
        await ws.send_json(tool_call(3, "beta__echo"))  # type: ignore[attr-defined]
        assert "result" in await ws.hear()  # type: ignore[attr-defined]
        assert {spec.labels[LABEL_SERVICE] for spec in http.runtime.spawned} == {"beta"}
        await ws.aclose()  # type: ignore[attr-defined]


async def test_a_servers_stderr_line_with_a_value_is_logged_and_kept_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RF_TEST_GITHUB_TOKEN", VALUE)
    services = {
        "github": Service(
            image="fake/github:1",
            secrets={"GITHUB_TOKEN": SecretSource(env="RF_TEST_GITHUB_TOKEN", as_="env")},
        )
    }
    caplog.set_level(logging.INFO, logger="reactor_fabric")
    async with served(tmp_path, server=leaky_server, learn_catalog=True, services=services) as http:
        ws = await open_fabric_session(http)
        await ws.send_json(tool_call(2, "github__crash"))  # type: ignore[attr-defined]
        failed = await ws.hear()  # type: ignore[attr-defined]
        assert failed["error"]["data"]["reason"] == "container_exited"
        details = json.dumps(failed)
        assert f"debug: using token {REDACTED}" in details
        assert VALUE not in details
        [spec] = http.runtime.spawned
        assert spec.environment["GITHUB_TOKEN"] == VALUE  # it did reach the server
        await ws.aclose()  # type: ignore[attr-defined]
    lines = [
        r.__dict__.get("line", "") for r in caplog.records if r.getMessage() == "container_stderr"
    ]
    assert f"debug: using token {REDACTED}" in lines
    stream = io.StringIO()
    for record in caplog.records:
        stream.write(JsonFormatter().format(record))
    assert VALUE not in stream.getvalue()


async def test_nothing_is_resolved_or_delivered_for_a_suite_without_secrets(tmp_path: Path) -> None:
    async with served(tmp_path) as http:
        assert http.fabric.secrets == {}
        assert http.fabric.starter.identity.secrets_account is None
    await trio.lowlevel.checkpoint()


# --- Kubernetes: a Secret per service, referenced from the pod -----------------------------


def k8s_spec(user: str | None = None) -> ContainerSpec:
    return container_spec_for(
        "github",
        Service(image="img", user=user),
        session_id="s1",
        identity=identity({"github": RESOLVED}),
        capabilities=EVERY_CAPABILITY,
    )


def test_a_pod_refers_to_its_services_secret_and_never_holds_a_value() -> None:
    spec = k8s_spec()
    pod = valid(pod_manifest(spec, namespace="mcp"))
    text = json.dumps(pod)
    assert VALUE not in text
    assert FILE_VALUE not in text
    name = secret_name(spec)
    [container] = pod["spec"]["containers"]
    env = {entry["name"]: entry for entry in container["env"]}
    for variable in ("GITHUB_TOKEN", "ONLY_ENV"):
        assert env[variable] == {
            "name": variable,
            "valueFrom": {"secretKeyRef": {"name": name, "key": variable}},
        }
    assert "DB_PASSWORD" not in env  # as: file
    assert env["USER"] == {"name": "USER", "value": "nobody"}  # the rest as before
    [volume] = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert volume["secret"] == {
        "secretName": name,
        "defaultMode": 0o440,
        "items": [
            {"key": "GITHUB_TOKEN", "path": "GITHUB_TOKEN"},
            {"key": "DB_PASSWORD", "path": "DB_PASSWORD"},
        ],
    }
    assert {"name": volume["name"], "mountPath": SECRETS_DIR, "readOnly": True} in container[
        "volumeMounts"
    ]
    # The files' group is the server's (a secret volume's files are root's).
    assert pod["spec"]["securityContext"] == {"fsGroup": 65534}


def test_a_server_whose_user_is_a_uid_alone_gets_the_files_group_of_that_uid() -> None:
    # runAsUser without runAsGroup: the server's group is the image's for the uid (nogroup,
    # say), and the Secret volume's files are root's: the uid's own group must be the
    # fsGroup, which the kubelet adds to the server's groups (the Docker runtime: uid:uid).
    pod = valid(pod_manifest(k8s_spec(user="1000"), namespace="mcp"))
    assert pod["spec"]["securityContext"] == {"fsGroup": 1000}
    assert "runAsGroup" not in pod["spec"]["containers"][0]["securityContext"]
    assert valid(pod_manifest(k8s_spec(user="1000:2000"), namespace="mcp"))["spec"][
        "securityContext"
    ] == {"fsGroup": 2000}


def test_the_services_secret_holds_every_value_labelled_like_its_pods() -> None:
    spec = k8s_spec()
    secret = valid(secret_manifest(spec, namespace="mcp", owner={"name": "orch", "uid": "u1"}))
    assert secret["metadata"]["name"] == secret_name(spec)
    assert secret["metadata"]["labels"] == {
        "reactor-fabric.managed": "true",
        "reactor-fabric.instance": "inst1",
        "reactor-fabric.service": "github",
    }
    assert secret["metadata"]["ownerReferences"][0]["name"] == "orch"
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == {"GITHUB_TOKEN": VALUE, "ONLY_ENV": VALUE + "-env", "DB_PASSWORD": FILE_VALUE}


async def test_the_kubernetes_runtime_makes_the_secret_once_before_the_pods_and_removes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = KubernetesRuntime(namespace="mcp")
    calls: list[tuple[str, str, dict[str, object]]] = []
    answers = iter([409, 200, 201, 200])  # an earlier try's Secret is there: replaced

    async def api(
        action: str, method: str, url: str, **kwargs: object
    ) -> tuple[int, dict[str, object]]:
        await trio.lowlevel.checkpoint()
        calls.append((method, url, kwargs))
        return next(answers), {}

    monkeypatch.setattr(runtime._calls, "json", api)
    spec = k8s_spec()
    await runtime._ensure_secret(spec)
    await runtime._ensure_secret(spec)  # a second container of the service: nothing more
    name = secret_name(spec)
    assert [(m, u) for m, u, _ in calls] == [
        ("POST", "secrets"),
        ("DELETE", f"secrets/{name}"),
        ("POST", "secrets"),
    ]
    assert calls[0][2]["json"]["kind"] == "Secret"  # type: ignore[index]
    await runtime.close()
    assert calls[-1][:2] == ("DELETE", f"secrets/{name}")


async def test_a_secret_the_api_server_refuses_refuses_the_start_as_secret_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = KubernetesRuntime(namespace="mcp")

    async def api(
        action: str, method: str, url: str, **kwargs: object
    ) -> tuple[int, dict[str, object]]:
        await trio.lowlevel.checkpoint()
        return 403, {"message": "secrets is forbidden"}

    monkeypatch.setattr(runtime._calls, "json", api)
    with pytest.raises(ContainerStartFailure, match="HTTP 403: secrets is forbidden") as caught:
        await runtime.spawn(k8s_spec())
    assert caught.value.reason == "secret_unavailable"


# --- the operators' routes: shown as the trail writes it ---------------------------------------


async def echoing_server(container: MemoryServer) -> None:
    """Fails every tool call with an error that repeats its token (a careless server)."""
    token = container.spec.environment.get("GITHUB_TOKEN", "")
    while (line := await container.read_line()) is not None:
        message = json.loads(line)
        if message.get("method") == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "echoing", "version": "1"},
            }
            answer = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        elif message.get("method") == "tools/call":
            error = {
                "code": -32000,
                "message": f"token {token} refused",
                "data": {"reason": f"refused:{token}"},
            }
            answer = {"jsonrpc": "2.0", "id": message["id"], "error": error}
        else:
            continue
        await container.write_stdout(json.dumps(answer).encode() + b"\n")


async def test_a_value_a_client_and_a_server_put_in_a_call_is_redacted_on_every_operator_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RF_TEST_GITHUB_TOKEN", VALUE)
    services = {
        "github": Service(
            image="fake/github:1",
            secrets={"GITHUB_TOKEN": SecretSource(env="RF_TEST_GITHUB_TOKEN", as_="env")},
        )
    }
    trail = tmp_path / "audit.jsonl"
    audit = AuditWriter(trail, max_bytes=1 << 20, keep=1)
    audit.open()
    observer = Observer(services=services, audit=audit)
    pages: dict[str, bytes] = {}
    async with served(tmp_path, server=echoing_server, services=services, observer=observer) as (
        http
    ):
        # The client knows the value (it is the token's owner, say) and puts it everywhere a
        # client can: its user agent, a tool's name, the request's id, the arguments.
        ws, _ = await http.websocket(
            "/mcp/github", headers=[(b"user-agent", f"agent/{VALUE}".encode())]
        )
        await ws.send_json(INITIALIZE)
        assert "result" in await ws.hear()
        await ws.send_json(INITIALIZED)
        params = {"name": f"use-{VALUE}", "arguments": {"t": VALUE}}
        await ws.send_json(request(f"id-{VALUE}", "tools/call", params))
        failed = await ws.hear()
        assert failed["error"]["data"]["reason"] == f"refused:{VALUE}"  # the server's own words
        for path in ("/api/calls", "/api/sessions", "/api/stats"):
            reply = await http.http("GET", path)
            assert reply.status == 200
            pages[path] = reply.body
        await ws.aclose()
    observer.close()

    for path, body in pages.items():
        assert VALUE.encode() not in body, path
    [shown] = json.loads(pages["/api/calls"])["calls"]
    assert shown["tool"] == f"use-{REDACTED}"
    assert shown["request_id"] == f"id-{REDACTED}"
    assert shown["error_reason"] == f"refused:{REDACTED}"
    assert shown["client"]["user_agent"] == f"agent/{REDACTED}"
    [session] = json.loads(pages["/api/sessions"])["sessions"]
    assert session["client"]["user_agent"] == f"agent/{REDACTED}"
    [container] = session["recent_containers"]  # which container served which call
    assert container["recent_calls"] == [
        {"id": f"id-{REDACTED}", "method": "tools/call", "name": f"use-{REDACTED}"}
    ]
    # What the page shows of the call is what the trail has (but its chain).
    [written] = [r for r in read_records(trail) if r["event"] == "tool_call"]
    assert {key: value for key, value in written.items() if key != "prev"} == shown
    assert VALUE not in trail.read_text()
