"""The live status page (``GET /``): one HTML file shipped in the package, nothing from a CDN.

Its script and style are inline, and allowed by hash in a strict content security policy: the
page may talk only to the orchestrator it came from, load nothing else, and never be framed.
The page reads the token from its own URL (``/?token=…``) and sends it as a Bearer header with
each API request; ``no-referrer`` keeps that URL out of other sites' logs.
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


CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; script-src {_hashes(b'script')}; style-src {_hashes(b'style')}; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
PAGE_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
]
