"""A signed-in user's tool calls a minute: a bucket of ``per_minute`` calls refilled over the
minute, shared by all their sessions, saying when the next call would be taken; bounded in
the users it remembers."""

from __future__ import annotations

import pytest

from reactor_fabric.protocol import call_rates
from reactor_fabric.protocol.call_rates import CallRates, UserCallRate


def test_a_burst_of_the_limit_is_taken_then_the_next_waits_for_its_share_of_the_minute() -> None:
    rates = CallRates()
    alice = UserCallRate(rates, "alice", 6)  # one every 10 s
    assert [alice.refusal(0.0) for _ in range(6)] == [None] * 6
    refused = alice.refusal(1.0)
    assert refused is not None
    assert (refused.code, refused.reason) == (-32002, "rate_limited")
    assert refused.detail == {"limit": 6, "retry_after_seconds": 9.0}
    assert "9 s" in str(refused)
    assert alice.refusal(9.9) is not None
    assert alice.refusal(10.1) is None  # (the one call that came back)
    assert alice.refusal(10.2) is not None


def test_sessions_of_one_user_share_the_bucket_and_other_users_have_their_own() -> None:
    rates = CallRates()
    one, other = UserCallRate(rates, "alice", 2), UserCallRate(rates, "alice", 2)
    bob = UserCallRate(rates, "bob", 2)
    assert one.refusal(0.0) is None
    assert other.refusal(0.0) is None
    assert one.refusal(0.0) is not None
    assert bob.refusal(0.0) is None


def test_the_buckets_are_bounded_forgetting_idle_users_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(call_rates, "MAX_TRACKED_USERS", 3)
    rates = CallRates()
    for user, at in (("a", 0.0), ("b", 100.0), ("c", 100.0)):
        rates.take(user, 1, at)
    rates.take("d", 1, 120.0)  # "a" idle for two minutes: forgotten first
    assert set(rates.buckets) == {"b", "c", "d"}
    rates.take("e", 1, 121.0)  # nobody idle: the oldest goes
    assert len(rates.buckets) == 3
    assert "e" in rates.buckets
