"""The live status page (``GET /``): one HTML file shipped in the package, nothing from a CDN.

Its script and style are inline, and allowed by hash in a strict content security policy: the
page may talk only to the orchestrator it came from, load nothing else, and never be framed.
The page reads the token from its own URL (``/?token=…``) and sends it as a Bearer header with
each API request; ``no-referrer`` keeps that URL out of other sites' logs. When users sign in
(``auth.mode: oidc``) the page itself is served to anyone (it holds no data) and signs its user
in as a public client of the issuer — the code flow with PKCE back to the page — keeping the
access token for its tab only; its policy then lets it reach the issuer's origin too.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

STATUS_PAGE = resources.files(__package__).joinpath("status.html").read_bytes()


def _hashes(tag: bytes) -> str:
    blocks = re.findall(rb"<%b>(.*?)</%b>" % (tag, tag), STATUS_PAGE, re.DOTALL)
    return " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(block).digest()).decode() + "'"
        for block in blocks
    )


def content_security_policy(issuer_origin: str | None = None) -> str:
    """The page's policy; ``issuer_origin``: when users sign in, the one other origin its
    script may reach (the issuer's discovery, registration and token endpoints)."""
    connect = "'self'" if issuer_origin is None else f"'self' {issuer_origin}"
    return (
        f"default-src 'none'; script-src {_hashes(b'script')}; style-src {_hashes(b'style')}; "
        f"connect-src {connect}; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )


def page_headers(issuer_origin: str | None = None) -> list[tuple[bytes, bytes]]:
    """The page's security headers (see :func:`content_security_policy`)."""
    return [
        (b"content-security-policy", content_security_policy(issuer_origin).encode()),
        (b"referrer-policy", b"no-referrer"),
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
    ]


CONTENT_SECURITY_POLICY = content_security_policy()
PAGE_HEADERS = page_headers()
