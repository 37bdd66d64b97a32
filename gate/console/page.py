"""The console's page: one static file (`page.html`, package data) with its script and style inside.

It holds no data: it asks for the token, keeps it in the tab's memory (sessionStorage, never a
cookie), and reads the API with it in the Authorization header. Its Content-Security-Policy lets
only its own script and style run (by their digests) and only this origin be read: no external
network, no frame around it.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response


@cache
def _page() -> tuple[str, str]:
    text = resources.files("gate.console").joinpath("page.html").read_text(encoding="utf-8")

    def digests(tag: str) -> str:
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
        return " ".join(
            "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'" for body in found
        )

    policy = (
        f"default-src 'none'; script-src {digests('script')}; style-src {digests('style')}; connect-src 'self';"
        " img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return text, policy


async def page(request: Request) -> Response:
    text, policy = _page()
    headers = {"Content-Security-Policy": policy, "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"}
    return HTMLResponse(text, headers=headers)
