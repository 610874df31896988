"""Who a connection on the egress proxy's TCP way in (Kubernetes pods) belongs to: the token in
its Proxy-Authorization, decided without I/O (reactor_fabric.protocol.egress.identify)."""

from __future__ import annotations

import base64
import urllib.parse
import urllib.request

import pytest

from reactor_fabric._reasons import EGRESS_UNAUTHORIZED
from reactor_fabric.observe.redaction import Redactor
from reactor_fabric.protocol.egress import (
    EgressRefused,
    identify,
    proxy_url,
    read_request,
    refusal_response,
    token_of,
)

TOKEN = "k3y-of_the.pod0123456789abcdefghij"
PODS = [("other-token-of-another-pod", "pod-b"), (TOKEN, "pod-a")]


def basic(credentials: str) -> bytes:
    return b"Basic " + base64.b64encode(credentials.encode())


def test_the_pod_whose_token_the_request_carries_is_the_one_identified() -> None:
    assert identify(basic(f"rf:{TOKEN}"), PODS) == "pod-a"
    assert identify(basic("rf:other-token-of-another-pod"), PODS) == "pod-b"


@pytest.mark.parametrize(
    "authorization",
    [
        b"",
        basic("rf:not-a-token-of-anyone"),
        basic(f"someone:{TOKEN}"),
        basic("rf:"),
        basic(TOKEN),
        b"Bearer " + TOKEN.encode(),
        b"Basic !!!not-base64",
        basic(f"rf:{TOKEN}x"),
        basic(f"rf:{TOKEN[:-1]}"),
    ],
)
def test_a_request_without_a_served_pods_token_is_refused_407(authorization: bytes) -> None:
    with pytest.raises(EgressRefused) as refused:
        identify(authorization, PODS)
    assert (refused.value.status, refused.value.reason) == (407, EGRESS_UNAUTHORIZED)
    assert TOKEN not in str(refused.value)


def test_with_no_pod_served_every_request_is_refused() -> None:
    with pytest.raises(EgressRefused):
        identify(basic(f"rf:{TOKEN}"), [])


def test_the_scheme_is_read_whatever_its_case_and_spacing() -> None:
    assert token_of(b"  basic   " + base64.b64encode(f"rf:{TOKEN}".encode()) + b" ") == (
        TOKEN.encode()
    )


def test_the_request_head_carries_its_proxy_authorization_and_never_forwards_it() -> None:
    tunnel = read_request(
        b"CONNECT api.github.com:443 HTTP/1.1\r\nHost: api.github.com:443\r\n"
        b"Proxy-Authorization: " + basic(f"rf:{TOKEN}") + b"\r\n\r\n"
    )
    assert tunnel is not None
    assert identify(tunnel.authorization, PODS) == "pod-a"
    forward = read_request(
        b"GET http://example.org/x HTTP/1.1\r\nHost: example.org\r\n"
        b"Proxy-Authorization: " + basic(f"rf:{TOKEN}") + b"\r\n\r\n"
    )
    assert forward is not None
    assert forward.authorization == basic(f"rf:{TOKEN}")
    assert b"Proxy-Authorization" not in forward.head
    assert TOKEN.encode() not in forward.head


def test_the_407_answer_asks_for_basic_credentials() -> None:
    answer = refusal_response(407, EGRESS_UNAUTHORIZED, "who are you")
    assert answer.startswith(b"HTTP/1.1 407 Proxy Authentication Required\r\n")
    assert b'\r\nProxy-Authenticate: Basic realm="reactor-fabric"\r\n' in answer


def test_the_proxy_url_is_one_clients_take_the_credentials_from() -> None:
    url = proxy_url(TOKEN, "10.1.2.3", 3128)
    parts = urllib.parse.urlsplit(url)
    assert (parts.username, parts.password, parts.hostname, parts.port) == (
        "rf",
        TOKEN,
        "10.1.2.3",
        3128,
    )
    # Python's urllib sends exactly the header identify reads.
    request = urllib.request.Request("http://example.org/")
    urllib.request.ProxyHandler({"http": url}).proxy_open(request, url, "http")
    assert identify(request.get_header("Proxy-authorization", "").encode(), PODS) == "pod-a"
    assert urllib.parse.urlsplit(proxy_url(TOKEN, "fd00::1", 3128)).hostname == "fd00::1"


def test_a_pods_token_is_redacted_while_registered_and_forgotten_after() -> None:
    redactor = Redactor()
    redactor.register(["a-suite-secret-value"])
    redactor.register([TOKEN])
    assert redactor.redact(f"proxy http://rf:{TOKEN}@10.0.0.1:3128") == (
        "proxy http://rf:[REDACTED]@10.0.0.1:3128"
    )
    redactor.forget([TOKEN])
    assert TOKEN in redactor.redact(f"http://rf:{TOKEN}@x")
    assert redactor.redact("a-suite-secret-value") == "[REDACTED]"  # the others stay
