"""The egress proxy's judgement (reactor_fabric.protocol.egress), as pure functions: what an
allowlist entry is, which destinations pass, which resolved addresses may be connected to, and
what a request head asks for."""

from __future__ import annotations

import ipaddress
import itertools

import h11
import pytest

from reactor_fabric._reasons import (
    EGRESS_ADDRESS_REFUSED,
    EGRESS_BAD_REQUEST,
    EGRESS_NOT_LISTED,
)
from reactor_fabric.protocol.egress import (
    MAX_REQUEST_HEAD,
    Allowlist,
    Destination,
    EgressRefused,
    choose_address,
    is_special,
    judge_target,
    parse_destination,
    read_request,
    refusal_response,
)


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


# --- entries --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("api.github.com:443", "api.github.com", 443),
        ("API.GitHub.com.:443", "api.github.com", 443),
        ("127.0.0.1:8080", "127.0.0.1", 8080),
        ("[::1]:8080", "::1", 8080),
        ("[::ffff:127.0.0.1]:80", "127.0.0.1", 80),
        ("localhost:1", "localhost", 1),
        ("_srv.example.org:65535", "_srv.example.org", 65535),
    ],
)
def test_an_entry_is_a_host_and_a_port_in_the_form_they_are_compared_in(
    text: str, host: str, port: int
) -> None:
    assert parse_destination(text) == Destination(host, port)


@pytest.mark.parametrize(
    "text",
    [
        "api.github.com",  # no port
        "api.github.com:0",
        "api.github.com:65536",
        "api.github.com:https",
        "::1:8080",  # an IPv6 address without brackets
        ":443",
        "exa mple.com:443",
        "-bad.example.com:443",
        "a" * 64 + ".com:443",
        "127.1:80",  # read as an address by resolvers: it must be written as one
        "2130706433:80",
        "http://example.com:80",
    ],
)
def test_an_entry_that_is_not_host_and_port_is_refused_with_what_to_write(text: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_destination(text)


# --- the destination as named ---------------------------------------------------------------


GITHUB = Allowlist.of(["api.github.com:443", "127.0.0.1:8080"])


def test_a_listed_name_passes_and_the_same_name_on_another_port_does_not() -> None:
    judge_target(Destination("api.github.com", 443), GITHUB)
    with pytest.raises(EgressRefused) as refused:
        judge_target(Destination("api.github.com", 80), GITHUB)
    assert (refused.value.reason, refused.value.status) == (EGRESS_NOT_LISTED, 403)


def test_an_address_passes_only_when_listed_as_that_address() -> None:
    judge_target(Destination("127.0.0.1", 8080), GITHUB)
    for host in ("140.82.112.6", "127.0.0.2", "localhost"):
        with pytest.raises(EgressRefused, match="not in this service's egress list"):
            judge_target(Destination(host, 8080 if host != "140.82.112.6" else 443), GITHUB)


def test_an_empty_list_lets_nothing_through() -> None:
    with pytest.raises(EgressRefused):
        judge_target(Destination("api.github.com", 443), Allowlist.of([]))


# --- the addresses a name resolved to ------------------------------------------------------


SPECIAL = [
    "127.0.0.1",
    "127.8.9.10",
    "169.254.169.254",  # the cloud metadata service
    "10.1.2.3",
    "172.16.0.1",
    "192.168.1.1",
    "100.64.0.1",  # shared address space (carrier NAT)
    "0.0.0.0",
    "224.0.0.1",
    "255.255.255.255",
    "192.0.2.1",  # documentation
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
]
PUBLIC = ["140.82.112.6", "1.1.1.1", "2606:4700:4700::1111"]


@pytest.mark.parametrize("address", SPECIAL)
def test_a_listed_name_resolving_to_a_special_address_is_refused(address: str) -> None:
    with pytest.raises(EgressRefused) as refused:
        choose_address(Destination("api.github.com", 443), [ip(address)], GITHUB)
    assert (refused.value.reason, refused.value.status) == (EGRESS_ADDRESS_REFUSED, 403)
    assert is_special(ip(address))


@pytest.mark.parametrize("address", PUBLIC)
def test_a_listed_name_resolving_to_a_public_address_is_connected_to(address: str) -> None:
    assert choose_address(Destination("api.github.com", 443), [ip(address)], GITHUB) == ip(address)


def test_a_special_address_is_allowed_when_it_is_itself_listed_with_that_port() -> None:
    allowlist = Allowlist.of(["localhost:8080", "127.0.0.1:8080"])
    chosen = choose_address(Destination("localhost", 8080), [ip("127.0.0.1")], allowlist)
    assert chosen == ip("127.0.0.1")
    # Listed for another port: not for this one.
    elsewhere = Allowlist.of(["localhost:9090", "127.0.0.1:8080"])
    with pytest.raises(EgressRefused):
        choose_address(Destination("localhost", 9090), [ip("127.0.0.1")], elsewhere)


def test_an_ipv4_mapped_address_is_judged_as_the_ipv4_address_it_is() -> None:
    allowlist = Allowlist.of(["local.test:80", "127.0.0.1:80"])
    chosen = choose_address(Destination("local.test", 80), [ip("::ffff:127.0.0.1")], allowlist)
    assert chosen == ip("127.0.0.1")


def test_the_first_address_that_may_be_connected_to_is_chosen_in_the_resolvers_order() -> None:
    resolved = [ip("169.254.169.254"), ip("140.82.112.6"), ip("1.1.1.1")]
    assert choose_address(Destination("api.github.com", 443), resolved, GITHUB) == ip(
        "140.82.112.6"
    )


def test_a_name_that_resolved_to_nothing_is_refused() -> None:
    with pytest.raises(EgressRefused, match="no address"):
        choose_address(Destination("api.github.com", 443), [], GITHUB)


def test_every_choice_over_every_small_case_is_public_or_listed_as_that_address() -> None:
    # Exhaustive over names, ports, address sets and allowlists: the address chosen is never a
    # special one unless that very address and port is listed, and a refusal happens only when
    # every address was special and unlisted.
    addresses = [ip(a) for a in ("127.0.0.1", "169.254.169.254", "10.0.0.1", "::1", "1.1.1.1")]
    entries = ["svc.test:80", "127.0.0.1:80", "127.0.0.1:81", "10.0.0.1:80", "[::1]:80"]
    checked = 0
    for size in range(len(entries) + 1):
        for chosen_entries in itertools.combinations(entries, size):
            allowlist = Allowlist.of(chosen_entries)
            for port in (80, 81):
                destination = Destination("svc.test", port)
                for count in range(len(addresses) + 1):
                    for resolved in itertools.permutations(addresses, count):
                        checked += 1
                        allowed = [
                            a
                            for a in resolved
                            if not is_special(a) or Destination(str(a), port) in allowlist.entries
                        ]
                        try:
                            got = choose_address(destination, list(resolved), allowlist)
                        except EgressRefused:
                            assert allowed == []
                        else:
                            assert got == allowed[0]
    assert checked > 10_000


# --- the request head --------------------------------------------------------------------------


def test_a_connect_asks_for_a_tunnel_and_keeps_what_followed_the_head() -> None:
    request = read_request(b"CONNECT api.github.com:443 HTTP/1.1\r\nHost: x\r\n\r\n\x16\x03\x01")
    assert request is not None
    assert (request.kind, request.destination) == ("tunnel", Destination("api.github.com", 443))
    assert request.rest == b"\x16\x03\x01"


def test_a_connect_to_a_bracketed_ipv6_address_names_that_address() -> None:
    request = read_request(b"CONNECT [::1]:8080 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert request is not None
    assert request.destination == Destination("::1", 8080)


def test_an_incomplete_head_asks_for_more() -> None:
    assert read_request(b"CONNECT api.github.com:443 HTTP/1.1\r\nHost:") is None


def test_an_absolute_request_is_forwarded_in_origin_form_without_proxy_headers() -> None:
    request = read_request(
        b"POST http://127.0.0.1:8080/v1/messages?beta=true HTTP/1.1\r\n"
        b"Host: 127.0.0.1:8080\r\nProxy-Authorization: Basic c2VjcmV0\r\n"
        b"Proxy-Connection: keep-alive\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert request is not None
    assert (request.kind, request.destination) == ("forward", Destination("127.0.0.1", 8080))
    head = request.head.decode()
    assert head.startswith("POST /v1/messages?beta=true HTTP/1.1\r\n")
    assert "proxy-" not in head.lower()
    assert "keep-alive" not in head.lower()
    assert head.lower().count("connection: close") == 1
    assert "Content-Length: 2" in head
    assert request.rest == b"{}"


def test_an_absolute_request_without_a_port_goes_to_port_80() -> None:
    request = read_request(b"GET http://example.org HTTP/1.1\r\nHost: example.org\r\n\r\n")
    assert request is not None
    assert request.destination == Destination("example.org", 80)
    assert request.head.startswith(b"GET / HTTP/1.1\r\n")


@pytest.mark.parametrize(
    "head",
    [
        b"GET /relative HTTP/1.1\r\nHost: x\r\n\r\n",  # not a proxy request
        b"GET https://example.org/ HTTP/1.1\r\nHost: x\r\n\r\n",  # must be a CONNECT
        b"CONNECT example.org HTTP/1.1\r\nHost: x\r\n\r\n",  # no port
        b"CONNECT exa_mple..org:443 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET http://user:pw@example.org/ HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http\r\n\r\n",
    ],
)
def test_a_request_the_proxy_does_not_serve_is_a_400(head: bytes) -> None:
    with pytest.raises(EgressRefused) as refused:
        read_request(head)
    assert (refused.value.reason, refused.value.status) == (EGRESS_BAD_REQUEST, 400)


def test_a_head_over_the_bound_is_refused_before_it_ends() -> None:
    endless = b"CONNECT a.test:443 HTTP/1.1\r\nX: " + b"a" * (MAX_REQUEST_HEAD + 10)
    with pytest.raises(EgressRefused) as refused:
        read_request(endless)
    assert refused.value.status == 400


def head_of(size: int, *, line: int = 0, target: bytes = b"a.test:443", more: bytes = b"") -> bytes:
    """A complete CONNECT head of exactly ``size`` bytes (its blank line included), padded by
    one header or, with ``line``, by many header lines of about that size each; ``more``:
    header lines of the caller's first."""
    start, end = b"CONNECT %s HTTP/1.1\r\nHost: x\r\n%s" % (target, more), b"\r\n"
    room = size - len(start) - len(end)
    lines: list[bytes] = []
    if line:
        while len(padding := b"X-%d: %s\r\n" % (len(lines), b"v" * line)) + 5 < room:
            lines.append(padding)
            room -= len(padding)
    lines.append(b"X: " + b"a" * (room - 5) + b"\r\n")
    head = start + b"".join(lines) + end
    assert len(head) == size
    return head


@pytest.mark.parametrize("size", [MAX_REQUEST_HEAD + 1, 40_000, 1 << 20])
def test_a_complete_head_over_the_bound_in_one_piece_is_refused(size: int) -> None:
    # h11 bounds only an *incomplete* head: a complete one of any size, read at once, was parsed
    # (a 40 KB CONNECT head was tunnelled).
    with pytest.raises(EgressRefused) as refused:
        read_request(head_of(size) + b"tunnelled bytes")
    assert (refused.value.reason, refused.value.status) == (EGRESS_BAD_REQUEST, 400)


def test_a_head_over_the_bound_of_many_small_header_lines_is_refused() -> None:
    with pytest.raises(EgressRefused) as refused:
        read_request(head_of(MAX_REQUEST_HEAD + 100, line=10))
    assert (refused.value.reason, refused.value.status) == (EGRESS_BAD_REQUEST, 400)


def test_a_head_over_the_bound_is_refused_whichever_way_it_was_cut_into_reads() -> None:
    # The proxy asks again with everything read so far after each read: every prefix either
    # waits for more within the bound or is refused, and none is ever a request.
    head = head_of(MAX_REQUEST_HEAD + 1, line=40)
    for end in [*range(0, len(head), 997), len(head) - 1, len(head)]:
        if end < MAX_REQUEST_HEAD:
            assert read_request(head[:end]) is None
        else:
            with pytest.raises(EgressRefused) as refused:
                read_request(head[:end])
            assert refused.value.status == 400


def test_a_head_of_exactly_the_bound_is_read_with_what_follows_it_as_its_rest() -> None:
    # What follows the head (a tunnel's first bytes, a body) is not the head's: it may be large.
    for line in (0, 10):
        head = head_of(MAX_REQUEST_HEAD, line=line)
        request = read_request(head + b"x" * 100_000)
        assert request is not None
        assert request.destination == Destination("a.test", 443)
        assert request.rest == b"x" * 100_000


def test_a_refusal_is_a_complete_http_answer_naming_its_reason() -> None:
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    client.receive_data(refusal_response(403, EGRESS_NOT_LISTED, "x.test:443 is not listed"))
    response = client.next_event()
    assert isinstance(response, h11.Response)
    assert response.status_code == 403
    assert (b"x-reactor-fabric-reason", EGRESS_NOT_LISTED.encode()) in list(response.headers)
    body = client.next_event()
    assert isinstance(body, h11.Data)
    assert EGRESS_NOT_LISTED in bytes(body.data).decode()
