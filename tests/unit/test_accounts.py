from __future__ import annotations

import os
import pwd

import pytest

from reactor_fabric.policy.accounts import UNPRIVILEGED, Account, account_named, server_ids

NOBODY = (UNPRIVILEGED.uid, UNPRIVILEGED.gid)
ALICE = (1000, 1000)
BOB = (1001, 1001)
ROOT = (0, 0)


@pytest.mark.parametrize(
    ("first_mount_owner", "orchestrator", "expected"),
    [
        # No mount: the server sees no host file and needs nobody's rights.
        (None, ROOT, NOBODY),
        (None, ALICE, NOBODY),
        # An orchestrator run by a user: its sessions act for that user, whoever owns the files.
        (ALICE, ALICE, ALICE),
        (BOB, ALICE, ALICE),
        (ROOT, ALICE, ALICE),
        # Run by root: the project's owner, so that what the server writes is theirs...
        (ALICE, ROOT, ALICE),
        (BOB, ROOT, BOB),
        # ...but never root, and never root's group.
        (ROOT, ROOT, NOBODY),
        ((0, 1000), ROOT, NOBODY),
        ((1000, 0), ROOT, (1000, UNPRIVILEGED.gid)),
    ],
)
def test_the_server_runs_as_the_user_the_session_acts_for_and_never_as_root(
    first_mount_owner: tuple[int, int] | None,
    orchestrator: tuple[int, int],
    expected: tuple[int, int],
) -> None:
    assert server_ids(first_mount_owner=first_mount_owner, orchestrator=orchestrator) == expected


def test_an_account_is_named_after_the_hosts_user_of_that_uid() -> None:
    uid = os.getuid()
    assert account_named(uid, 5) == Account(uid, 5, pwd.getpwuid(uid).pw_name)


def test_an_account_unknown_to_the_host_gets_a_made_up_name() -> None:
    unknown = next(uid for uid in range(4242, 5000) if not _known(uid))
    assert account_named(unknown, unknown).name == f"user{unknown}"


def test_the_unprivileged_account_is_nobody_by_number() -> None:
    assert account_named(65534, 65534) is UNPRIVILEGED
    assert UNPRIVILEGED.docker_user == "65534:65534"


def _known(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
