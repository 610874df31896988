"""The server-side WebSocket framing, checked against wsproto's client as the reference: what
wsproto sends, we read as it meant; what we send, wsproto reads as we meant — for every size
class, every way of cutting the bytes, fragmented or not, and every protocol violation."""

from __future__ import annotations

import random
import struct

import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import CloseConnection
from wsproto.events import Message as WsMessage
from wsproto.events import Ping as WsPing
from wsproto.events import TextMessage as WsText
from wsproto.frame_protocol import FrameProtocol

from reactor_fabric.protocol.websocket_frames import (
    CLOSE,
    PING,
    BinaryMessage,
    Close,
    FrameDecoder,
    FrameError,
    Ping,
    Pong,
    TextMessage,
    close_frame,
    control_frame,
    text_frame,
    unmask,
)

SIZES = [0, 1, 125, 126, 127, 65535, 65536, 100_000]


def client_frames(*events: object) -> bytes:
    """What a real client (wsproto) sends for these events, masked."""
    proto = FrameProtocol(client=True, extensions=[])
    data = b""
    for event in events:
        if isinstance(event, WsMessage):
            data += proto.send_data(event.data, event.message_finished)
        elif isinstance(event, WsPing):
            data += proto.ping(event.payload)
        elif isinstance(event, CloseConnection):
            data += proto.close(event.code, event.reason)
    return data


def decode(data: bytes, *, chunk: int | None = None, limit: int = 1 << 20) -> list[object]:
    decoder = FrameDecoder(max_message=limit)
    if chunk is None:
        return list(decoder.feed(data))
    events: list[object] = []
    for start in range(0, len(data), chunk):
        events += decoder.feed(data[start : start + chunk])
    return events


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("chunk", [None, 1, 7, 4096])
def test_a_text_message_of_any_size_in_any_chunking_is_read_as_sent(
    size: int, chunk: int | None
) -> None:
    text = ("é" * (size // 2) + "x" * (size % 2)) if size else ""
    if chunk == 1 and size > 70_000:
        chunk = 997  # byte by byte is too slow for the largest; still many pieces
    events = decode(client_frames(WsText(data=text)), chunk=chunk)
    assert events == [TextMessage(text.encode())]


def test_fragments_are_joined_and_control_frames_may_come_between_them() -> None:
    data = client_frames(
        WsText(data='{"a":', message_finished=False),
        WsPing(payload=b"p1"),
        WsText(data="1", message_finished=False),
        WsText(data="}", message_finished=True),
    )
    for chunk in (None, 1, 3):
        assert decode(data, chunk=chunk) == [Ping(b"p1"), TextMessage(b'{"a":1}')]


def test_a_character_split_across_fragments_is_valid_utf8() -> None:
    euro = "€".encode()
    data = b"".join(
        _raw_frame(opcode, payload, fin)
        for opcode, payload, fin in (
            (0x1, euro[:1], False),
            (0x0, euro[1:], True),
        )
    )
    assert decode(data) == [TextMessage(euro)]


def test_many_random_conversations_are_read_exactly() -> None:
    rng = random.Random(20261122)
    for _ in range(300):
        events: list[object] = []
        expected: list[object] = []
        for _ in range(rng.randint(1, 6)):
            size = rng.choices([0, 3, 130, 70_000], weights=[3, 5, 3, 1])[0]
            text = "".join(rng.choices('aé{}"€', k=size))
            pieces = rng.randint(1, 4)
            cuts = sorted(rng.sample(range(len(text) + 1), min(pieces - 1, len(text) + 1)))
            parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            for index, part in enumerate(parts):
                last = index == len(parts) - 1
                events.append(WsText(data=part, message_finished=last))
                if last:
                    expected.append(TextMessage(text.encode()))
                if rng.random() < 0.2:
                    payload = rng.randbytes(rng.randint(0, 125))
                    events.append(WsPing(payload=payload))
                    expected.append(Ping(payload))
        data = client_frames(*events)
        chunk = rng.choice([None, 1, 2, 13, 1000]) if len(data) < 10_000 else 997
        assert decode(data, chunk=chunk) == expected


def _raw_frame(opcode: int, payload: bytes, fin: bool = True, *, mask: bool = True) -> bytes:
    """A frame written by hand (for what a well-behaved library never sends)."""
    first = (0x80 if fin else 0) | opcode
    length = len(payload)
    head = bytes([first])
    flag = 0x80 if mask else 0
    if length < 126:
        head += bytes([flag | length])
    elif length < 65536:
        head += bytes([flag | 126]) + struct.pack("!H", length)
    else:
        head += bytes([flag | 127]) + struct.pack("!Q", length)
    if not mask:
        return head + payload
    key = b"\x01\x02\x03\x04"
    return head + key + unmask(payload, key)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (_raw_frame(0x1, b"hi", mask=False), 1002),
        (bytes([0xC1, 0x82]) + b"\x00" * 4 + b"hi", 1002),  # RSV1 without an extension
        (_raw_frame(0x3, b"?"), 1002),  # unknown data opcode
        (_raw_frame(0xB, b""), 1002),  # unknown control opcode
        (_raw_frame(PING, b"x" * 126), 1002),  # control frame over 125 bytes
        (_raw_frame(PING, b"", fin=False), 1002),  # fragmented control frame
        (_raw_frame(0x0, b"more"), 1002),  # continuation with no message
        (_raw_frame(0x1, b"a", fin=False) + _raw_frame(0x1, b"b"), 1002),  # message in message
        (_raw_frame(0x1, b"\xff\xfe"), 1007),
        (_raw_frame(0x1, b"\xe2", fin=False) + _raw_frame(0x0, b"\x28\xa1"), 1007),
        (_raw_frame(CLOSE, b"\x03"), 1002),  # one-byte close payload
        (_raw_frame(CLOSE, struct.pack("!H", 1005)), 1002),  # a code never sent on the wire
        (_raw_frame(CLOSE, struct.pack("!H", 1000) + b"\xff"), 1007),
    ],
    ids=[
        "unmasked",
        "reserved-bits",
        "unknown-data-opcode",
        "unknown-control-opcode",
        "long-control",
        "fragmented-control",
        "stray-continuation",
        "message-in-message",
        "bad-utf8",
        "bad-utf8-across-fragments",
        "one-byte-close",
        "reserved-close-code",
        "bad-utf8-close-reason",
    ],
)
def test_every_protocol_violation_is_refused_with_its_close_code(data: bytes, code: int) -> None:
    for chunk in (None, 1):
        with pytest.raises(FrameError) as caught:
            decode(data, chunk=chunk)
        assert caught.value.code == code


def test_a_message_over_the_limit_is_refused_from_its_header_before_its_payload_is_kept() -> None:
    header_only = _raw_frame(0x1, b"x" * 5000)[:8]  # 2 + 2 length bytes + 4 mask bytes
    with pytest.raises(FrameError) as caught:
        FrameDecoder(max_message=4096).feed(header_only)
    assert caught.value.code == 1009
    fragments = _raw_frame(0x1, b"x" * 3000, fin=False) + _raw_frame(0x0, b"x" * 3000)
    with pytest.raises(FrameError) as caught:
        decode(fragments, limit=4096)
    assert caught.value.code == 1009


def test_binary_messages_pongs_and_closes_are_reported() -> None:
    data = (
        _raw_frame(0x2, b"\x00\x01")
        + _raw_frame(0xA, b"pong")
        + _raw_frame(CLOSE, b"")
        + _raw_frame(CLOSE, struct.pack("!H", 4000) + "bye ✓".encode())
    )
    assert decode(data) == [BinaryMessage(), Pong(b"pong"), Close(None, ""), Close(4000, "bye ✓")]


@pytest.mark.parametrize("size", SIZES)
def test_what_we_send_a_client_reads_as_we_meant(size: int) -> None:
    client = Connection(ConnectionType.CLIENT)  # wsproto's frame layer, after a handshake
    payload = ("é" * (size // 2) + "x" * (size % 2)).encode()
    client.receive_data(text_frame(payload) + control_frame(PING, b"hb") + close_frame(1000, "ok"))
    events = list(client.events())
    assert isinstance(events[0], WsText)
    assert events[0].data.encode() == payload
    assert isinstance(events[1], WsPing)
    assert events[1].payload == b"hb"
    assert isinstance(events[2], CloseConnection)
    assert (events[2].code, events[2].reason) == (1000, "ok")


def test_a_long_close_reason_is_cut_to_fit_without_splitting_a_character() -> None:
    frame = close_frame(1008, "é" * 200)
    assert len(frame) == 2 + 125 - 1  # 2 code bytes + 122 bytes of whole "é"s
    decoded = decode(_raw_frame(CLOSE, frame[2:]))
    assert decoded == [Close(1008, "é" * 61)]


def test_unmasking_is_its_own_inverse_at_every_length() -> None:
    rng = random.Random(7)
    for size in range(0, 40):
        payload, key = rng.randbytes(size), rng.randbytes(4)
        masked = unmask(payload, key)
        assert unmask(masked, key) == payload
        assert masked == bytes(b ^ key[i % 4] for i, b in enumerate(payload))
