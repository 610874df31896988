"""The pods/attach channel protocol, message by message, as an API server sends them."""

from __future__ import annotations

import json

import pytest

from reactor_fabric.protocol.k8s_attach import (
    V4,
    V5,
    AttachChannels,
    AttachProtocolError,
    AttachStatus,
    Output,
    StreamEnded,
)

# A non-zero exit as the kubelet reports it on the status channel (metav1.Status).
NON_ZERO = json.dumps(
    {
        "metadata": {},
        "status": "Failure",
        "message": "command terminated with non-zero exit code: exit status 3",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }
).encode()
SUCCESS = b'{"metadata":{},"status":"Success"}'


def test_a_v5_attach_from_open_to_exit() -> None:
    channels = AttachChannels(V5)
    received = [
        channels.receive(message)
        for message in (
            b"\x01",  # each stream opens with an empty message
            b"\x02",
            b"\x03",
            b'\x01{"jsonrpc":"2.0","id":1,"result":{}}\n',
            b"\x02starting\n",
            b"\xff\x01",
            b"\xff\x02",
            b"\x03" + NON_ZERO,
            b"\xff\x03",
        )
    ]
    assert received == [
        None,
        None,
        None,
        Output(1, b'{"jsonrpc":"2.0","id":1,"result":{}}\n'),
        Output(2, b"starting\n"),
        StreamEnded(1),
        StreamEnded(2),
        AttachStatus(
            success=False,
            exit_code=3,
            reason="NonZeroExitCode",
            message="command terminated with non-zero exit code: exit status 3",
        ),
        StreamEnded(3),
    ]
    assert channels.status is received[7]


def test_stdin_is_channel_zero_and_its_end_is_a_v5_close_signal() -> None:
    channels = AttachChannels(V5)
    assert channels.stdin(b'{"jsonrpc":"2.0"}\n') == b'\x00{"jsonrpc":"2.0"}\n'
    assert channels.close_stdin() == b"\xff\x00"
    with pytest.raises(AttachProtocolError, match="closed already"):
        channels.stdin(b"more")


def test_v4_has_no_half_close_the_websocket_itself_must_close() -> None:
    channels = AttachChannels(V4)
    assert not channels.can_half_close
    assert channels.close_stdin() is None
    # And 255 is no signal there: a server never sends it.
    with pytest.raises(AttachProtocolError, match="channel 255"):
        AttachChannels(V4).receive(b"\xff\x01")


def test_a_success_status_ends_the_attach_without_claiming_an_exit_code() -> None:
    status = AttachChannels(V5).receive(b"\x03" + SUCCESS)
    assert status == AttachStatus(success=True, exit_code=None, reason="", message="")


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (b"", "empty message"),
        (b"\x00data", "channel 0"),  # stdin is never sent by the server
        (b"\x04{}", "channel 4"),
        (b"\x09x", "channel 9"),
        (b"\xff", "malformed stream end"),
        (b"\xff\x01\x02", "malformed stream end"),
        (b"\xff\x00", "malformed stream end"),  # the server cannot end our stdin
        (b"\x03not json", "not a Status"),
        (b"\x03[1, 2]", "not a Status"),
        (b"\x03" + b"[" * 60_000, "not a Status"),  # deep, within the size bound
    ],
)
def test_what_the_protocol_does_not_allow_is_an_error_not_data(message: bytes, why: str) -> None:
    with pytest.raises(AttachProtocolError, match=why):
        AttachChannels(V5).receive(message)


def test_a_status_over_the_bound_is_refused_before_it_is_decoded() -> None:
    channels = AttachChannels(V5, max_status_bytes=100)
    with pytest.raises(AttachProtocolError, match="at most 100"):
        channels.receive(b"\x03" + b" " * 101)


def test_data_after_a_streams_end_and_a_second_status_are_errors() -> None:
    channels = AttachChannels(V5)
    channels.receive(b"\xff\x01")
    assert channels.receive(b"\x01") is None  # an empty message says nothing
    with pytest.raises(AttachProtocolError, match="after it ended"):
        channels.receive(b"\x01late")
    channels.receive(b"\x03" + SUCCESS)
    with pytest.raises(AttachProtocolError, match="second status"):
        channels.receive(b"\x03" + SUCCESS)


def test_only_the_channel_subprotocols_are_spoken() -> None:
    with pytest.raises(ValueError, match="base64"):
        AttachChannels("base64.channel.k8s.io")
