"""Admission as a pure decision (reactor_fabric.policy.admission): each refusal with its error
and the id it answers, and the order of the steps (a bad first message before anything, an
unknown service before its mounts, the capacity last)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reactor_fabric._errors import (
    InvalidRequest,
    ParseError,
    SecurityViolation,
    ServiceNotFound,
    SessionRefused,
)
from reactor_fabric.config.structs import FabricSettings, Orchestrator, Profile, Service, Suite
from reactor_fabric.config.suite import FABRIC_ENDPOINT
from reactor_fabric.policy.admission import (
    Admission,
    Capacity,
    FabricOptions,
    Refusal,
    admission,
    capacity,
    requested_options,
)
from reactor_fabric.protocol.handshake import ForwardFirst, RegisterClient
from tests.messages import INITIALIZE

SVC = Service(image="fake/svc:1")
SUITE = Suite(
    version="1.0",
    orchestrator=Orchestrator(
        allowed_mount_roots=["/data"], fabric=FabricSettings(default_exposure="all")
    ),
    mcp_services={"svc": SVC, "other": Service(image="fake/other:1")},
    profiles={"one": Profile(services=["other"])},
)
MOUNTS = [{"source": "/data", "target": "/work", "readOnly": True}]
REGISTER: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": "r1",
    "method": "fabric/registerClient",
    "params": {"mounts": MOUNTS},
}


def frame(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


def decide(
    first: bytes | dict[str, Any] = INITIALIZE,
    *,
    endpoint: str = "svc",
    query: dict[str, list[str]] | None = None,
    mounts: list[str] | None = None,
) -> Admission | Refusal:
    return admission(
        first if isinstance(first, bytes) else frame(first),
        endpoint=endpoint,
        suite=SUITE,
        query=query or {},
        query_mounts=mounts or [],
    )


def refusal(decision: Admission | Refusal) -> Refusal:
    assert isinstance(decision, Refusal), decision
    return decision


# --- step 1: the first message --------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "error_type", "reason", "request_id"),
    [
        (b"{not json", ParseError, "invalid_json", None),
        (
            frame({"jsonrpc": "2.0", "id": 4, "result": {}}),
            InvalidRequest,
            "unexpected_response",
            None,
        ),
        (
            frame({"jsonrpc": "2.0", "method": "fabric/registerClient", "params": {"mounts": []}}),
            InvalidRequest,
            "register_without_id",
            None,
        ),
        (
            frame({"jsonrpc": "2.0", "id": 9, "method": "fabric/registerClient", "params": {}}),
            InvalidRequest,
            "register_without_mounts",
            9,
        ),
    ],
)
def test_an_unusable_first_message_is_refused_with_its_own_error(
    first: bytes, error_type: type[Exception], reason: str, request_id: object
) -> None:
    refused = refusal(decide(first))
    assert isinstance(refused.error, error_type)
    assert refused.error.reason == reason
    assert refused.request_id == request_id


def test_a_bad_first_message_is_refused_before_the_endpoint_or_the_mounts_are_looked_at() -> None:
    for endpoint, query in (("nope", {}), (FABRIC_ENDPOINT, {"tools": ["some"]})):
        refused = refusal(decide(b"[]", endpoint=endpoint, query=query, mounts=[":"]))
        assert refused.error.reason == "batch_not_supported"


# --- step 2: the service --------------------------------------------------------------------


def test_an_unknown_service_is_refused_with_the_first_requests_id_and_its_name() -> None:
    refused = refusal(decide(endpoint="nope"))
    assert isinstance(refused.error, ServiceNotFound)
    assert refused.error.to_jsonrpc_error() == {
        "code": -32005,
        "message": "Service Not Found: no service named 'nope' in the suite",
        "data": {
            "reason": "service_not_found",
            "detail": "no service named 'nope' in the suite",
            "service": "nope",
        },
    }
    assert refused.request_id == INITIALIZE["id"]


def test_an_unknown_service_is_refused_before_its_mounts_are_looked_at() -> None:
    refused = refusal(decide(endpoint="nope", mounts=["no-colon-here"]))
    assert refused.error.reason == "service_not_found"
    refused = refusal(decide(REGISTER | {"params": {"mounts": "not a list"}}, endpoint="nope"))
    assert refused.error.reason == "service_not_found"


def test_the_query_of_a_service_endpoint_is_not_read_as_fabric_options() -> None:
    admitted = decide(query={"tools": ["some"], "profile": ["x"]})
    assert isinstance(admitted, Admission)
    assert admitted.options is None


# --- step 3: the fabric endpoint's options --------------------------------------------------


def test_an_unknown_exposure_is_refused_before_an_unknown_profile() -> None:
    refused = refusal(decide(endpoint=FABRIC_ENDPOINT, query={"tools": ["some"], "profile": ["x"]}))
    assert isinstance(refused.error, InvalidRequest)
    assert refused.error.reason == "unknown_exposure"
    assert refused.error.detail == {"supported": ["discover", "all"]}
    assert refused.request_id == INITIALIZE["id"]


def test_an_unknown_profile_is_refused_with_the_profiles_there_are() -> None:
    refused = refusal(decide(endpoint=FABRIC_ENDPOINT, query={"profile": ["x"]}))
    assert refused.error.reason == "profile_not_found"
    assert str(refused.error) == "no profile named 'x' in the suite (profiles: one)"


def test_bad_fabric_options_are_refused_before_the_mounts_are_looked_at() -> None:
    for query in ({"tools": ["some"]}, {"profile": ["x"]}):
        refused = refusal(decide(endpoint=FABRIC_ENDPOINT, query=query, mounts=["no-colon-here"]))
        assert refused.error.reason in {"unknown_exposure", "profile_not_found"}


def test_the_fabric_endpoint_is_admitted_with_its_options_and_no_service() -> None:
    admitted = decide(endpoint=FABRIC_ENDPOINT)
    assert isinstance(admitted, Admission)
    assert (admitted.service, admitted.options) == (None, FabricOptions("all"))
    chosen = decide(
        endpoint=FABRIC_ENDPOINT, query={"tools": ["all", "discover"], "profile": ["one"]}
    )
    assert isinstance(chosen, Admission)
    assert chosen.options == FabricOptions("discover", ("other",))  # the last value counts


# --- step 4: the mounts requested -------------------------------------------------------------


def test_a_malformed_query_mount_is_refused_with_the_first_requests_id() -> None:
    refused = refusal(decide(mounts=["/data:/work", "no-colon-here"]))
    assert isinstance(refused.error, SecurityViolation)
    assert refused.error.reason == "mount_malformed"
    assert refused.request_id == INITIALIZE["id"]


def test_the_query_mounts_are_requested_in_registerclients_shape() -> None:
    admitted = decide(mounts=["/data:/work:ro", "/src:/src"])
    assert isinstance(admitted, Admission)
    assert isinstance(admitted.first, ForwardFirst)
    assert admitted.service is SVC
    assert admitted.mounts == [
        {"source": "/data", "target": "/work", "readOnly": True},
        {"source": "/src", "target": "/src", "readOnly": False},
    ]


def test_registerclients_mounts_are_the_ones_requested_and_the_query_ones_are_not_read() -> None:
    admitted = decide(REGISTER, mounts=["no-colon-here"])
    assert isinstance(admitted, Admission)
    assert isinstance(admitted.first, RegisterClient)
    assert admitted.request_id == "r1"
    # Passed on as sent: their validation is the mount policy's (the step with I/O).
    assert admitted.mounts == MOUNTS


# --- step 5: capacity -------------------------------------------------------------------------


def test_a_session_is_admitted_while_there_is_room() -> None:
    assert capacity(Capacity(sessions=63, limit=64, stopping=False)) is None


def test_a_session_over_the_limit_is_refused_with_too_many_sessions() -> None:
    for live in (64, 65):
        full = capacity(Capacity(sessions=live, limit=64, stopping=False))
        assert isinstance(full, SessionRefused)
        assert full.reason == "too_many_sessions"
        assert str(full) == (
            "the orchestrator has reached its limit of concurrent sessions; try again later"
        )


def test_a_stopping_orchestrator_refuses_a_session_even_with_room_and_says_it_is_stopping() -> None:
    for live in (0, 64):
        stopping = capacity(Capacity(sessions=live, limit=64, stopping=True))
        assert isinstance(stopping, SessionRefused)
        assert stopping.reason == "orchestrator_stopping"
        assert str(stopping) == "the orchestrator is stopping"


def test_options_sent_as_headers_join_those_of_the_query_under_the_same_names() -> None:
    headers = {
        b"x-reactor-fabric-mount": "/a:/workspace, /b:/projects/b:ro",
        b"x-reactor-fabric-tools": "all",
        b"x-reactor-fabric-profile": " code ",
    }
    assert requested_options("mount=/q:/projects/q", headers) == {
        "mount": ["/q:/projects/q", "/a:/workspace", "/b:/projects/b:ro"],
        "tools": ["all"],
        "profile": ["code"],
    }
    assert requested_options("tools=discover", {}) == {"tools": ["discover"]}
    assert requested_options("", {b"x-reactor-fabric-mount": " , "}) == {}
