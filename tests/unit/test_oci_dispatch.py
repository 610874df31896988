"""Podman's dispatching runtime (deploy/podman/oci-dispatch): runc for every container, runsc
for those the orchestrator marks for gVisor — chosen at create from the bundle, remembered by
id for every later command — and nothing at all when it cannot tell or runsc is missing.

The program runs here with two fake runtimes that log how they were called (and fail when told
to), as Podman and conmon call a runtime (the calls seen from Podman 4.3.1)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

PROGRAM = Path(__file__).parents[2] / "deploy" / "podman" / "oci-dispatch"
ID = "fd5229a1bdce04571216f4f5c9adcdf6ab561eb88c4fcceaf24d055e3eaf13fb"
OTHER = "0c960dadb2b7b4154b4ab77ca3a06cce40ee77ccdbf17771f9930c182c2cc684"
MARK = "REACTOR_FABRIC_ISOLATION=gvisor"

FAKE = """#!/bin/sh
echo "{name} $*" >> "{log}"
[ "$1" = state ] && [ -n "${{FAKE_KNOWS:-}}" ] && exit 0
[ "$1" = state ] && exit 1
case " $* " in *" $FAKE_FAIL "*) exit 3 ;; esac
[ "$1" = --version ] && echo "{name} version 1"
exit 0
"""


class Dispatch:
    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "calls.log"
        self.state = tmp_path / "state"
        self.env = {
            "PATH": os.environ["PATH"],
            "OCI_DISPATCH_STATE": str(self.state),
            "FAKE_FAIL": "no-such-command",
        }
        for name in ("runc", "runsc"):
            fake = tmp_path / name
            fake.write_text(FAKE.format(name=name, log=self.log))
            fake.chmod(0o755)
            self.env[f"OCI_DISPATCH_{name.upper()}"] = str(fake)
        self.tmp_path = tmp_path

    def bundle(self, env: list[str], name: str = "bundle") -> Path:
        bundle = self.tmp_path / name
        bundle.mkdir()
        spec = {"ociVersion": "1.0.2", "process": {"args": ["sleep", "1"], "env": env}}
        (bundle / "config.json").write_text(json.dumps(spec))
        return bundle

    def __call__(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(PROGRAM), *args],
            env=self.env | env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def calls(self) -> list[str]:
        calls = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return calls

    def remembered(self) -> set[str]:
        return {p.name for p in self.state.iterdir()} if self.state.exists() else set()


@pytest.fixture
def dispatch(tmp_path: Path) -> Dispatch:
    return Dispatch(tmp_path)


def test_an_unmarked_container_runs_under_runc_with_podmans_arguments_unchanged(
    dispatch: Dispatch,
) -> None:
    bundle = dispatch.bundle(["PATH=/usr/bin", "HOME=/"])
    created = dispatch("create", "--bundle", str(bundle), "--pid-file", "/p", ID)
    assert created.returncode == 0, created.stderr
    assert dispatch.calls() == [f"runc create --bundle {bundle} --pid-file /p {ID}"]
    assert dispatch.remembered() == set()
    dispatch("start", ID)
    dispatch("kill", ID, "15")
    dispatch("delete", "--force", ID)
    assert dispatch.calls() == [
        f"runc start {ID}",
        f"runc kill {ID} 15",
        f"runc delete --force {ID}",
    ]


@pytest.mark.parametrize("form", ["--bundle", "-b", "--bundle="])
def test_a_marked_container_runs_under_runsc_and_every_later_command_follows_it(
    dispatch: Dispatch, form: str
) -> None:
    bundle = dispatch.bundle(["PATH=/usr/bin", MARK])
    where = [form + str(bundle)] if form.endswith("=") else [form, str(bundle)]
    created = dispatch("--systemd-cgroup", "create", *where, "--pid-file", "/p", ID)
    assert created.returncode == 0, created.stderr
    assert dispatch.calls() == [
        f"runsc --systemd-cgroup create {' '.join(where)} --pid-file /p {ID}"
    ]
    assert dispatch.remembered() == {ID}
    dispatch("start", ID)
    dispatch("exec", "--pid-file", "/e", "--process", "/proc.json", "--detach", ID)
    dispatch("kill", ID, "9")
    dispatch("--root", "/run/x", "state", ID)
    dispatch("kill", OTHER, "9")  # (another container, unmarked)
    assert dispatch.calls() == [
        f"runsc start {ID}",
        f"runsc exec --pid-file /e --process /proc.json --detach {ID}",
        f"runsc kill {ID} 9",
        f"runsc --root /run/x state {ID}",
        f"runc kill {OTHER} 9",
    ]
    deleted = dispatch("delete", "--force", ID)
    assert deleted.returncode == 0
    assert dispatch.calls() == [f"runsc delete --force {ID}"]
    assert dispatch.remembered() == set()
    dispatch("delete", "--force", ID)  # forgotten: runc's again (which says it has no such)
    assert dispatch.calls() == [f"runc delete --force {ID}"]


def test_a_failed_delete_keeps_the_container_runscs_while_runsc_still_knows_it(
    dispatch: Dispatch,
) -> None:
    dispatch("create", "--bundle", str(dispatch.bundle([MARK])), ID)
    failed = dispatch("delete", ID, FAKE_FAIL=ID, FAKE_KNOWS="1")
    assert failed.returncode == 3  # runsc's own status, passed on
    assert dispatch.remembered() == {ID}
    failed_unknown = dispatch("delete", ID, FAKE_FAIL=ID)  # (runsc's state: no such container)
    assert failed_unknown.returncode == 3
    assert dispatch.remembered() == set()


def test_a_failing_runtimes_status_and_words_reach_podman(dispatch: Dispatch) -> None:
    bundle = dispatch.bundle([MARK])
    created = dispatch("create", "--bundle", str(bundle), ID, FAKE_FAIL=ID)
    assert created.returncode == 3


def test_a_bundle_that_cannot_be_read_runs_nothing(dispatch: Dispatch) -> None:
    created = dispatch("create", "--bundle", str(dispatch.tmp_path / "absent"), ID)
    assert created.returncode == 1
    assert "cannot read" in created.stderr
    assert "refusing to choose a runtime" in created.stderr
    assert dispatch.calls() == []


def test_a_marked_container_without_runsc_is_refused_not_run_under_runc(
    dispatch: Dispatch,
) -> None:
    bundle = dispatch.bundle([MARK])
    created = dispatch(
        "create", "--bundle", str(bundle), ID, OCI_DISPATCH_RUNSC=str(dispatch.tmp_path / "none")
    )
    assert created.returncode == 1
    assert "asks for gVisor" in created.stderr
    assert "is missing" in created.stderr
    assert dispatch.calls() == []


@pytest.mark.parametrize("bad_id", ["../escape", "a/b", "", "x y"])
def test_a_marked_container_whose_id_cannot_name_a_file_is_refused(
    dispatch: Dispatch, bad_id: str
) -> None:
    bundle = dispatch.bundle([MARK])
    created = dispatch("create", "--bundle", str(bundle), bad_id)
    assert created.returncode == 1
    assert "not one this program can remember" in created.stderr
    assert dispatch.calls() == []
    assert not (dispatch.tmp_path / "escape").exists()


def test_the_mark_is_only_the_exact_variable_and_a_lookalike_is_runcs(dispatch: Dispatch) -> None:
    bundle = dispatch.bundle(
        ["REACTOR_FABRIC_ISOLATION=gvisorx", "X=REACTOR_FABRIC_ISOLATION=gvisor"]
    )
    dispatch("create", "--bundle", str(bundle), ID)
    assert dispatch.calls() == [f"runc create --bundle {bundle} {ID}"]


def test_the_mark_anywhere_in_the_bundle_errs_towards_gvisor(dispatch: Dispatch) -> None:
    bundle = dispatch.tmp_path / "bundle"
    bundle.mkdir()
    spec = {"process": {"args": ["echo", MARK], "env": []}}
    (bundle / "config.json").write_text(json.dumps(spec))
    dispatch("create", "--bundle", str(bundle), ID)
    assert dispatch.calls() == [f"runsc create --bundle {bundle} {ID}"]


def test_its_version_says_what_it_is_then_runcs(dispatch: Dispatch) -> None:
    said = dispatch("--version")
    assert said.returncode == 0
    lines = said.stdout.splitlines()
    assert lines[0].startswith("reactor-fabric oci-dispatch: runc, or runsc for containers marked")
    assert lines[1] == "runc version 1"
