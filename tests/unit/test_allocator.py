"""The C allocator's settings (reactor_fabric._allocator): applied with glibc, skipped without."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reactor_fabric import _allocator


def test_glibc_takes_the_settings_and_can_give_free_memory_back() -> None:
    # In a process of its own: the settings are the process's for good.
    code = (
        "from reactor_fabric import _allocator as a\n"
        "t = a.tune()\n"
        "print(t.tuned, repr(t.reason), isinstance(a.release_free_memory(), bool))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    if _allocator._glibc() is None:
        pytest.skip("this machine's C library is not glibc")
    assert done.stdout.split() == ["True", "''", "True"]


def test_without_glibc_nothing_is_changed_and_the_reason_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_allocator, "_glibc", lambda: None)
    assert _allocator.tune() == _allocator.Tuning(False, "the C library is not glibc")
    assert _allocator.release_free_memory() is False


def test_a_setting_the_library_refuses_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    class RefusingLibc:
        def mallopt(self, param: int, value: int) -> int:
            return 0 if param == _allocator.M_ARENA_MAX else 1

    monkeypatch.setattr(_allocator, "_glibc", RefusingLibc)
    tuning = _allocator.tune()
    assert not tuning.tuned
    assert str(_allocator.M_ARENA_MAX) in tuning.reason
