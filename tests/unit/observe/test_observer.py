"""One event, three views: the audit record, the metrics, and what the status page shows."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reactor_fabric.observe.audit import AuditWriter, read_records
from reactor_fabric.observe.metrics import LiveFigures, Metrics
from reactor_fabric.observe.observer import Client, Observer, token_id
from reactor_fabric.observe.page import CONTENT_SECURITY_POLICY, STATUS_PAGE
from reactor_fabric.observe.status import recent_calls, stats
from reactor_fabric.protocol.tool_calls import Arguments, ToolCall

CLIENT = Client(token_id("secret-token"), "127.0.0.1:5000", "websocket", "test/1")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def call(tool: str = "git_log", outcome: str = "ok", **fields: object) -> ToolCall:
    values: dict[str, object] = {
        "request_id": 1,
        "tool": tool,
        "service": None,
        "arguments": Arguments(sha256="ab" * 32),
        "outcome": outcome,
        "error_code": None,
        "error_reason": None,
        "duration": 0.25,
        "bytes_in": 10,
        "bytes_out": 20,
        "traceparent": None,
        **fields,
    }
    return ToolCall(**values)  # type: ignore[arg-type]


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def observed(tmp_path: Path) -> tuple[Observer, Path]:
    path = tmp_path / "audit.jsonl"
    audit = AuditWriter(path, max_bytes=1 << 20, keep=1)
    audit.open()
    observer = Observer(services=["git"], audit=audit)
    observer.metrics.know_tools({"git": ["git_log"]})
    return observer, path


def test_a_tool_call_becomes_one_record_and_one_count_under_bounded_labels(tmp_path: Path) -> None:
    observer, path = observed(tmp_path)
    for tool, service in [("git_log", "git"), ("made_up", "git"), ("git_log", "nope")]:
        observer.tool_call(
            call(tool), session="s", endpoint="relay", service=service, container="c1",
            client=CLIENT, trace_id="t" * 32,
        )  # fmt: skip
    observer.close()
    records = list(read_records(path))
    assert [(r["service"], r["tool"]) for r in records] == [
        ("git", "git_log"),
        ("git", "made_up"),
        ("nope", "git_log"),
    ]
    assert records[0]["client"] == {
        "token": CLIENT.token,
        "peer": "127.0.0.1:5000",
        "transport": "websocket",
        "user_agent": "test/1",
    }
    assert records[0]["duration_ms"] == 250.0
    figures = samples(observer.metrics)
    counted = {
        labels: value
        for (name, labels), value in figures.items()
        if name == "reactor_fabric_tool_calls_total"
    }
    assert counted == {
        (("outcome", "ok"), ("service", "git"), ("tool", "git_log")): 1,
        (("outcome", "ok"), ("service", "git"), ("tool", "other")): 1,
        (("outcome", "ok"), ("service", "other"), ("tool", "other")): 1,
    }


def test_call_durations_are_a_histogram_with_inclusive_upper_bounds_per_service() -> None:
    metrics = Metrics(["git"])
    for seconds in [0.001, 0.005, 0.0051, 2.0, 400.0]:
        metrics.tool_call("git", "git_log", "ok", seconds)
    metrics.tool_call("made-up", "x", "error", 0.2)
    figures = samples(metrics)
    buckets = {
        dict(labels)["le"]: value
        for (name, labels), value in figures.items()
        if name == "reactor_fabric_tool_call_duration_seconds_bucket"
        and dict(labels)["service"] == "git"
    }
    assert buckets["0.005"] == 2  # 0.005 itself is in the le="0.005" bucket
    assert buckets["0.01"] == 3
    assert buckets["2.5"] == 4
    assert buckets["300.0"] == 4
    assert buckets["+Inf"] == 5
    git = (("service", "git"),)
    assert figures[("reactor_fabric_tool_call_duration_seconds_count", git)] == 5
    assert figures[("reactor_fabric_tool_call_duration_seconds_sum", git)] == pytest.approx(
        402.0111
    )
    other = (("service", "other"),)
    assert figures[("reactor_fabric_tool_call_duration_seconds_count", other)] == 1


def test_a_tool_counted_as_other_before_the_catalog_knew_it_is_counted_by_name_after() -> None:
    metrics = Metrics(["git"])
    metrics.tool_call("git", "git_log", "ok", 0.1)
    metrics.know_tools({"git": ["git_log"]})
    metrics.tool_call("git", "git_log", "ok", 0.1)
    assert metrics.calls == {("git", "other", "ok"): 1, ("git", "git_log", "ok"): 1}


def test_a_calls_own_traceparent_names_its_trace_else_the_sessions(tmp_path: Path) -> None:
    observer, path = observed(tmp_path)
    observer.tool_call(
        call(traceparent=TRACEPARENT), session="s", endpoint="relay", service="git",
        container=None, client=None, trace_id="f" * 32,
    )  # fmt: skip
    observer.tool_call(
        call(), session="s", endpoint="relay", service="git", container=None, client=None,
        trace_id="f" * 32,
    )  # fmt: skip
    observer.close()
    assert [r["trace_id"] for r in read_records(path)] == [TRACEPARENT.split("-")[1], "f" * 32]


def test_the_token_is_never_recorded_only_a_short_hash_of_it() -> None:
    assert token_id(None) == "none"
    assert token_id("secret-token").startswith("sha256:")
    assert "secret" not in token_id("secret-token")
    assert token_id("secret-token") != token_id("other-token")


def test_live_figures_and_plain_counters_are_read_when_scraped() -> None:
    metrics = Metrics(["git", "time"])
    metrics.live = lambda: LiveFigures({"relay": 2}, {"git": 1})
    metrics.bytes_to_client += 123
    figures = samples(metrics)
    assert figures[("reactor_fabric_sessions", (("endpoint", "relay"),))] == 2
    assert figures[("reactor_fabric_sessions", (("endpoint", "fabric"),))] == 0
    assert figures[("reactor_fabric_containers", (("service", "git"),))] == 1
    assert figures[("reactor_fabric_containers", (("service", "time"),))] == 0
    assert figures[("reactor_fabric_relay_bytes_total", (("direction", "to_client"),))] == 123


def test_container_events_count_respawns_idle_teardowns_and_start_times() -> None:
    observer = Observer(services=["git"])
    for respawn in (False, True):
        observer.container_started(
            session="s", service="git", container="c", image="i", seconds=0.5, respawn=respawn
        )
    observer.container_stopped(
        session="s", service="git", container="c", reason="idle", exit_code=None
    )
    observer.container_stopped(
        session="s", service="git", container="c", reason="session_ended", exit_code=0
    )
    figures = samples(observer.metrics)
    assert figures[("reactor_fabric_respawns_total", ())] == 1
    assert figures[("reactor_fabric_idle_teardowns_total", ())] == 1
    assert (
        figures[
            (
                "reactor_fabric_container_start_seconds_count",
                (("service", "git"), ("source", "fresh")),
            )
        ]
        == 2
    )


def test_recent_calls_are_newest_first_and_filtered(tmp_path: Path) -> None:
    observer = Observer(services=["git", "time"])
    for index, (service, outcome) in enumerate(
        [("git", "ok"), ("time", "error"), ("git", "error")]
    ):
        observer.tool_call(
            call(outcome=outcome, request_id=index), session=f"s{index}", endpoint="relay",
            service=service, container=None, client=None, trace_id="t" * 32,
        )  # fmt: skip
    assert [c["request_id"] for c in recent_calls(observer.calls)] == [2, 1, 0]
    assert [c["request_id"] for c in recent_calls(observer.calls, service="git")] == [2, 0]
    assert [c["request_id"] for c in recent_calls(observer.calls, outcome="error", limit=1)] == [2]
    assert recent_calls(observer.calls, session="s1", tool="nope") == []


def test_stats_bucket_the_last_hour_per_minute_with_nearest_rank_percentiles() -> None:
    observer = Observer(services=["git"])
    now = 10_000 * 60.0
    for duration in [0.01 * n for n in range(1, 21)]:  # 20 calls in the current minute
        observer.tool_call(
            call(duration=duration), session="s", endpoint="relay", service="git", container=None,
            client=None, trace_id="t" * 32,
        )  # fmt: skip
    observer.calls = type(observer.calls)(
        [type(e)(now + 1, e.duration, e.service, e.outcome, e.record) for e in observer.calls]
    )
    figures = stats(observer.calls, [], now=now + 30)
    assert len(figures["buckets"]) == 60
    last = figures["buckets"][-1]
    assert last["calls_per_second"] == round(20 / 60, 4)
    assert last["latency"]["git"] == {"p50_ms": 100.0, "p95_ms": 190.0}
    assert all(b["calls_per_second"] == 0 for b in figures["buckets"][:-1])
    assert figures["services"] == ["git"]


def test_the_status_page_allows_exactly_its_own_script_and_style_and_nothing_else() -> None:
    for tag in (b"script", b"style"):
        [block] = re.findall(rb"<%b>(.*?)</%b>" % (tag, tag), STATUS_PAGE, re.DOTALL)
        digest = base64.b64encode(hashlib.sha256(block).digest()).decode()
        assert f"'sha256-{digest}'" in CONTENT_SECURITY_POLICY
    assert "default-src 'none'" in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert b"http://" not in STATUS_PAGE.replace(b"http://www.w3.org/2000/svg", b"")
    assert b"https://" not in STATUS_PAGE


def test_a_signed_in_users_calls_name_them_and_are_theirs_to_list() -> None:
    observer = Observer(services=["git"])
    clients = [
        Client("oidc", "peer", "websocket", user="alice", groups=("team-a",)),
        Client("oidc", "peer", "websocket", user="bob"),
        Client("none", "peer", "websocket"),
    ]
    for index, client in enumerate(clients):
        observer.tool_call(
            call(request_id=index), session=f"s{index}", endpoint="relay",
            service="git", container=None, client=client, trace_id="t" * 32,
        )  # fmt: skip
    records = recent_calls(observer.calls)
    assert records[-1]["client"]["user"] == "alice"
    assert records[-1]["client"]["groups"] == ["team-a"]
    assert "user" not in records[0]["client"]  # the token's holder: no user to name
    assert [c["request_id"] for c in recent_calls(observer.calls, user="alice")] == [0]
    assert [c["request_id"] for c in recent_calls(observer.calls, user="bob")] == [1]
    assert recent_calls(observer.calls, user="carol") == []
