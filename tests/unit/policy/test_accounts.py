from __future__ import annotations

import os
import pwd

import pytest

from reactor_fabric.policy.accounts import (
    SECRETS_ID_BASE,
    UNPRIVILEGED,
    Account,
    account_named,
    free_secrets_id,
    host_holds,
    secrets_account,
    server_ids,
    subordinate_ranges,
)

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


# --- the secrets' account -------------------------------------------------------------------


def test_the_secrets_account_is_the_first_id_no_host_account_group_or_range_holds() -> None:
    held = {2_000_000_000, 2_000_000_001}
    assert free_secrets_id(held.__contains__) == 2_000_000_002
    assert free_secrets_id(lambda _: True) is None  # the tries run out: refused, not guessed


def test_a_subordinate_range_holds_its_ids_as_an_account_does() -> None:
    ranges = subordinate_ranges(
        ["ann:100000:65536\n", "# a comment\n", "builder:1999999990:20\n", "broken:x:1\n", "\n"]
    )
    assert ranges == [range(100000, 165536), range(1999999990, 2000000010)]
    assert host_holds(2_000_000_005, ranges)
    assert not host_holds(2_000_000_010, ranges)
    assert host_holds(0, [])  # root's: an account of every host


def test_this_hosts_secrets_account_is_held_by_no_one_here() -> None:
    account = secrets_account()
    assert account is not None
    assert account.uid == account.gid >= SECRETS_ID_BASE
    with pytest.raises(KeyError):
        pwd.getpwuid(account.uid)
    assert account.name == "reactor-fabric-secrets"
