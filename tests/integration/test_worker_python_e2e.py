"""The bundled Python worker (images/worker-python) on the real engine, through ``/mcp`` with the
MCP Python SDK 2.x: each of its tools on a project of the client's (one failing test, one lint
finding), the refusals a client sees (an absolute path, ``..``, a link out of the project), its
bounds (output past 64 KiB, a run past its timeout), and packages installed from a package index
this test serves on the host's loopback — reached through the egress proxy when the service
lists it, refused when it does not — lasting the session and gone for the next one. The tools'
test runs under gVisor and under runc (the engine's runtime, and the kernel the worker's code
sees: gVisor's ``dmesg``); the others under the bundled suite's ``prefer-gvisor`` (gVisor:
``make test`` registers it).
"""

from __future__ import annotations

import base64
import hashlib
import io
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.integration.harness import (
    BUNDLED,
    CLIENT_IDS,
    LineProcess,
    Orchestrator,
    containers_of,
    engine_is_podman,
    give_to_client,
    orchestrator,
    python2_client,
    wait_until,
    write_suite,
)

pytestmark = pytest.mark.integration

TARGET = "/projects/app"  # (not the image's /workspace: the worker finds its mount)
SERVICE = "python_worker"
PACKAGE = "rfdemo"
BUNDLED_WORKER_IMAGE = BUNDLED["mcp_services"][SERVICE]["image"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A client's project: a test that passes and one that fails, a module with an unused
    import, a link that leads out of it."""
    root = tmp_path / "projects" / "app"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_maths.py").write_text(
        "def test_adds():\n    assert 1 + 1 == 2\n\n\n"
        "def test_subtracts():\n    assert 3 - 1 == 1, 'subtraction is off'\n"
    )
    (root / "app.py").write_text("import os\n\nVALUE = 1\n")
    # (A dot-name: pytest's collection, which follows links to directories, leaves it alone.)
    (root / ".outside").symlink_to("/etc")
    return give_to_client(root)


def wheel(name: str, version: str, source: str) -> tuple[str, bytes]:
    """A pure-Python wheel of one module, ``name/__init__.py`` = ``source``, with a console
    script ``NAME-hello`` (its ``main``), a ``.pth`` file that sets ``NAME_PTH`` in the
    environment of every interpreter started after the install, and its RECORD."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": source.encode(),
        f"{name}_hook.pth": f"import os; os.environ['{name.upper()}_PTH'] = 'read'\n".encode(),
        f"{dist}/entry_points.txt": f"[console_scripts]\n{name}-hello = {name}:main\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return f"{name}-{version}-py3-none-any.whl", buffer.getvalue()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def package_index(tmp_path: Path) -> Iterator[int]:
    """A PEP 503 simple index on this host's loopback with one package, ``rfdemo`` 1.0."""
    root = tmp_path / "index"
    filename, data = wheel(
        PACKAGE,
        "1.0",
        "VALUE = 'installed from the test index'\n\n\ndef main():\n    print('its script ran')\n",
    )
    (root / "packages").mkdir(parents=True)
    (root / "packages" / filename).write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    (root / "simple" / PACKAGE).mkdir(parents=True)
    (root / "simple" / "index.html").write_text(f'<a href="{PACKAGE}/">{PACKAGE}</a>\n')
    (root / "simple" / PACKAGE / "index.html").write_text(
        f'<a href="../../packages/{filename}#sha256={digest}">{filename}</a>\n'
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def worker_suite(
    tmp_path: Path, project: Path, *, index: int, listed: bool, isolation: str | None = None
) -> Path:
    """The bundled suite with its worker told of the test's index, listed in its egress or not
    (and with another ``isolation`` than the bundled one, when given)."""
    fields: dict[str, Any] = {
        "env": {"PIP_INDEX_URL": f"http://127.0.0.1:{index}/simple"},
        # Not listed: another destination is (the proxy is there and refuses it).
        "egress": [f"127.0.0.1:{index if listed else 9}"],
    }
    if isolation is not None:
        fields["isolation"] = isolation
    return write_suite(
        tmp_path / "suite.yaml", [str(project.parent) + "/"], service_fields={SERVICE: fields}
    )


def runtime_of(client: docker.DockerClient, container: Any) -> str:
    """The OCI runtime the engine runs ``container`` with (Podman's compatible inspect says
    "oci" whatever it is: its own API says which)."""
    if engine_is_podman(client):
        url = f"{client.api.base_url}/v4.0.0/libpod/containers/{container.id}/json"
        answer = client.api.get(url)
        answer.raise_for_status()
        return str(answer.json()["OCIRuntime"])
    return str(container.attrs["HostConfig"].get("Runtime"))


# Where Podman's dispatching runtime (deploy/podman/oci-dispatch) remembers the containers it
# gave runsc.
DISPATCHED = Path("/run/reactor-fabric/oci-dispatch")


KERNEL = (
    "import subprocess\n"
    "seen = subprocess.run(['dmesg'], capture_output=True, text=True)\n"
    "print('gVisor' in seen.stdout)\n"
)


def connected(running: Orchestrator, project: Path) -> LineProcess:
    client = python2_client(f"{running.http_url}/mcp?tools=all&mount={project}:{TARGET}")
    initialized = client.ask({"op": "initialize"})
    assert initialized["ok"], initialized
    return client


def call(client: LineProcess, tool: str, **arguments: Any) -> dict[str, Any]:
    return client.ask(
        {"op": "call", "name": f"{SERVICE}__{tool}", "arguments": arguments}, timeout=180
    )


def ok(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["ok"], answer
    structured: dict[str, Any] = answer["structured"]
    return structured


def error_text(answer: dict[str, Any]) -> str:
    assert not answer["ok"], answer
    return " ".join(str(part.get("text", "")) for part in answer["content"])


@pytest.mark.parametrize("isolation", ["gvisor", "runc"])
def test_every_worker_tool_works_on_the_clients_project_through_the_fabric_endpoint(
    tmp_path: Path,
    project: Path,
    package_index: int,
    isolation: str,
    docker_client: docker.DockerClient,
) -> None:
    suite = worker_suite(tmp_path, project, index=package_index, listed=True, isolation=isolation)
    with orchestrator(suite, tmp_path / "orchestrator.log") as running:
        client = connected(running, project)
        try:
            listed = client.ask({"op": "list_tools"})
            kernel = call(client, "run_python", code=KERNEL)
            [container] = containers_of(docker_client, instance=running.instance)
            runtime = runtime_of(docker_client, container)
            dispatched_to_runsc = (DISPATCHED / container.id).exists()
            ran = call(
                client,
                "run_python",
                code="import os, pathlib\npathlib.Path('made.txt').write_text('by run_python')\n"
                "print(os.getcwd(), os.getuid())\nimport sys; print('oops', file=sys.stderr)\n"
                "raise SystemExit(3)\n",
            )
            imported = call(client, "run_python", code="import app; print(app.VALUE)")
            failed = call(client, "run_python", code="def f():\n    1 / 0\n\nf()\n")
            tests = call(client, "run_tests")
            one_test = call(client, "run_tests", path="tests/test_maths.py::test_adds")
            linted = call(client, "lint")
            many_imports = "".join(f"import module{n}\n" for n in range(1500))
            call(client, "write_file", path="many/imports.py", content=many_imports)
            many = call(client, "lint", path="many")
            read = call(client, "read_file", path="made.txt")
            written = call(client, "write_file", path="notes/todo.md", content="- check\n")
            listing = call(client, "list_files", path="", recursive=True)
            absolute = call(client, "read_file", path="/etc/passwd")
            parent = call(client, "read_file", path="../../etc/passwd")
            through_link = call(client, "read_file", path=".outside/passwd")
            write_out = call(client, "write_file", path=".outside/planted", content="x")
            test_out = call(client, "run_tests", path=".outside")
            loud = call(client, "run_python", code="print('x' * 200_000)")
            slow = call(client, "run_python", code="import time\ntime.sleep(30)", timeout=1)
            status = call(client, "run_python", code="print('still serving')")
        finally:
            assert client.close() == 0
        wait_until(
            lambda: sum(r["event"] == "tool_call" for r in running.audit()) >= 19,
            what="the calls' audit records",
        )
        audited = [r for r in running.audit() if r["event"] == "tool_call"]

    assert listed["ok"], listed
    # The engine's runtime, and the kernel the code meets.
    if engine_is_podman(docker_client):
        # Podman's API drops the runtime a container names: its default runtime, the
        # dispatcher, ran the container — under runsc when marked for gVisor.
        assert runtime == "reactor-fabric-dispatch", runtime
        assert dispatched_to_runsc is (isolation == "gvisor")
    else:
        assert (runtime == "runsc") is (isolation == "gvisor"), runtime
    assert ok(kernel)["stdout"] == f"{isolation == 'gvisor'}\n"
    tools = {name.removeprefix(f"{SERVICE}__") for name in listed["tools"] if SERVICE in name}
    assert tools == {
        "run_python", "pip_install", "run_tests", "lint", "read_file", "write_file", "list_files"
    }  # fmt: skip
    # Code runs in the project, as the project's owner; its exit status and both streams.
    python = ok(ran)
    assert python["exit_code"] == 3
    assert python["stdout"] == f"{TARGET} {CLIENT_IDS[0]}\n"
    assert python["stderr"] == "oops\n"
    made = project / "made.txt"
    assert made.read_text() == "by run_python"
    # The project's modules import (its directory first on sys.path); a traceback is the
    # code's own (the interpreter started ahead leaves no frame of its own in it).
    assert ok(imported)["stdout"] == "1\n"
    crashed = ok(failed)
    assert crashed["exit_code"] == 1
    assert crashed["stderr"].splitlines()[-1] == "ZeroDivisionError: division by zero"
    assert "line 4, in <module>" in crashed["stderr"]
    assert "worker_boot" not in crashed["stderr"]
    assert (made.stat().st_uid, made.stat().st_gid) == CLIENT_IDS
    # The tests: counts and the failing test's id with its first lines.
    counts = ok(tests)
    assert (counts["passed"], counts["failed"], counts["errors"], counts["skipped"]) == (1, 1, 0, 0)
    assert counts["exit_code"] == 1
    [failure] = counts["failures"]
    assert failure["id"] == "tests/test_maths.py::test_subtracts"
    assert "subtraction is off" in failure["message"]
    assert (ok(one_test)["passed"], ok(one_test)["failed"]) == (1, 0)
    # No cache or bytecode left in the client's project by the runs.
    assert not (project / ".pytest_cache").exists()
    assert not list(project.rglob("__pycache__"))
    # The lint finding, where it is.
    findings = ok(linted)["findings"]
    assert {(f["file"], f["line"], f["code"]) for f in findings} >= {("app.py", 1, "F401")}
    # Past the bound: the first 1000 listed, all counted (ruff's report read whole).
    assert (ok(many)["total"], len(ok(many)["findings"]), ok(many)["truncated"]) == (
        1500,
        1000,
        True,
    )
    assert ok(many)["findings"][0]["file"] == "many/imports.py"
    # Files.
    assert ok(read)["content"] == "by run_python"
    assert ok(written) == {"path": "notes/todo.md", "bytes_written": 8, "size": 8}
    assert (project / "notes" / "todo.md").read_text() == "- check\n"
    paths = {(e["path"], e["type"]) for e in ok(listing)["entries"]}
    assert {("made.txt", "file"), ("notes/todo.md", "file"), (".outside", "link")} <= paths
    assert not any(path.startswith(".outside/") for path, _ in paths)
    # Refusals, as the client shows them.
    assert "absolute paths are not allowed" in error_text(absolute)
    assert "'..' is not allowed" in error_text(parent)
    assert "leads out of the workspace" in error_text(through_link)
    assert "leads out of the workspace" in error_text(write_out)
    assert "leads out of the workspace" in error_text(test_out)
    assert not (Path("/etc") / "planted").exists()
    # Bounds: output past 64 KiB kept in part and said; a run past its timeout killed.
    bounded = ok(loud)
    assert bounded["stdout_truncated"] is True
    assert len(bounded["stdout"].encode()) < 70_000
    assert "truncated: 200001 bytes in all" in bounded["stdout"]
    assert "run_python: timed out after 1 s" in error_text(slow)
    assert ok(status)["stdout"] == "still serving\n"
    # Every call audited under the worker.
    assert sum(r.get("service") == SERVICE for r in audited) >= 15


def test_packages_install_from_the_listed_index_and_last_the_session_only(
    tmp_path: Path, project: Path, package_index: int
) -> None:
    suite = worker_suite(tmp_path, project, index=package_index, listed=True)
    with orchestrator(suite, tmp_path / "orchestrator.log") as running:
        client = connected(running, project)
        try:
            refused = call(client, "pip_install", packages=["--index-url=http://elsewhere/"])
            installed = call(client, "pip_install", packages=[PACKAGE])
            used = call(client, "run_python", code=f"import {PACKAGE}; print({PACKAGE}.VALUE)")
            # (the interpreter waiting for this call was started after the install)
            pth = call(client, "run_python", code="import os; print(os.environ.get('RFDEMO_PTH'))")
            # Its console script runs from the session's environment (/tmp: exec there).
            script = call(
                client,
                "run_python",
                code=f"import subprocess; subprocess.run(['{PACKAGE}-hello'], check=True)",
            )
            tested = call(client, "run_tests")  # (the image's pytest, beside the installs)
        finally:
            assert client.close() == 0
        later = connected(running, project)
        try:
            gone = call(later, "run_python", code=f"import {PACKAGE}")
        finally:
            assert later.close() == 0
        egress = [r for r in running.audit() if r["event"] == "egress"]

    assert "is not a package requirement" in error_text(refused)
    result = ok(installed)
    assert result["installed"] == [{"name": PACKAGE, "version": "1.0"}]
    assert result["requested"] == [PACKAGE]
    assert ok(used)["stdout"] == "installed from the test index\n"
    assert ok(pth)["stdout"] == "read\n"
    assert ok(script)["stdout"] == "its script ran\n", script
    assert ok(tested)["passed"] == 1
    # Outside the project: nothing of the environment is in the client's files.
    assert not list(project.rglob(f"{PACKAGE}*"))
    # The next session's container has its own, fresh environment.
    assert ok(gone)["exit_code"] == 1
    assert "ModuleNotFoundError" in ok(gone)["stderr"]
    assert egress, "pip reached the index through the egress proxy"
    assert {r["destination"] for r in egress} == {f"127.0.0.1:{package_index}"}, egress


def test_an_index_the_service_does_not_list_is_not_reached(
    tmp_path: Path, project: Path, package_index: int
) -> None:
    suite = worker_suite(tmp_path, project, index=package_index, listed=False)
    with orchestrator(suite, tmp_path / "orchestrator.log") as running:
        client = connected(running, project)
        try:
            refused = call(client, "pip_install", packages=[PACKAGE], timeout=60)
        finally:
            assert client.close() == 0
        wait_until(
            lambda: any(r["event"] == "egress" for r in running.audit()),
            what="the egress refusal's audit record",
        )
        egress = [r for r in running.audit() if r["event"] == "egress"]

    text = error_text(refused)
    assert "pip_install failed" in text
    assert "HTTP 403 (egress_not_listed)" in text
    assert f"No matching distribution found for {PACKAGE}" in text
    assert {(r["destination"], r["outcome"], r.get("reason")) for r in egress} == {
        (f"127.0.0.1:{package_index}", "refused", "egress_not_listed")
    }, egress


def test_gvisor_asked_for_where_the_engine_has_none_is_refused_and_preferred_falls_back(
    tmp_path: Path, project: Path, package_index: int
) -> None:
    image = BUNDLED_WORKER_IMAGE
    suite = write_suite(
        tmp_path / "suite.yaml",
        [str(project.parent) + "/"],
        service_fields={SERVICE: {"isolation": "gvisor"}},
        test_services={"preferring": {"image": image, "isolation": "prefer-gvisor"}},
        # A runtime the engine does not have: as on a machine without gVisor.
        gvisor_runtime="runsc-not-registered",
    )
    with orchestrator(suite, tmp_path / "orchestrator.log") as running:
        client = connected(running, project)
        try:
            refused = call(client, "run_python", code="print(1)")
            fell_back = client.ask(
                {"op": "call", "name": "preferring__run_python", "arguments": {"code": KERNEL}},
                timeout=180,
            )
            statuses = []

            def unavailable_listed() -> bool:
                status = client.ask({"op": "call", "name": "get_status", "arguments": {}})
                statuses.append(status)
                return SERVICE in ok(status)["unavailable"]

            # (Shown so even when its offer was learned before, by an orchestrator that could
            # start it: the catalog's cache is shared.)
            wait_until(unavailable_listed, what="get_status listing the worker unavailable")
        finally:
            assert client.close() == 0
        said = {
            e["service"]: (e["asked"], e["runs_under"])
            for e in running.logs()
            if e["event"] == "service_isolation"
        }

    # The client is told why, with the documented code and reason.
    assert not refused["ok"], refused
    assert refused["error"]["code"] == -32002
    assert refused["error"]["data"]["reason"] == "isolation_unavailable"
    assert "runsc-not-registered" in refused["error"]["message"]
    assert ok(statuses[-1])["unavailable"][SERVICE]["reason"] == "isolation_unavailable"
    # Preferred: runc, and said so at the start.
    assert ok(fell_back)["stdout"] == "False\n"
    assert said[SERVICE] == ("gvisor", "unavailable")
    assert said["preferring"] == ("prefer-gvisor", "runc")
    assert said["code_reviewer"] == ("prefer-gvisor", "runc")  # (an agent's default)
    # validate-config --engine finds the same before anything is served.
    checked = subprocess.run(
        [sys.executable, "-m", "reactor_fabric", "validate-config", "--engine", str(suite)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 1, checked
    assert f"service {SERVICE}: isolation_unavailable: asks for isolation: gvisor" in checked.stderr
    assert "service preferring: runs under runc (prefer-gvisor:" in checked.stdout
