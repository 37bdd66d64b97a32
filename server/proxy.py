"""Running behind a reverse proxy: which forwarded headers to believe, and the public URL.

uvicorn's `ProxyHeadersMiddleware` does the parsing: `X-Forwarded-For` and
`X-Forwarded-Proto` count only when the direct peer is a configured trusted proxy.
This subclass also records whether the request came through one, so the public URL
(agent cards, the 402's `resource.url`) is taken from the request only then: a direct
client cannot make the gate name another host.
"""

from __future__ import annotations

import ipaddress

from starlette.requests import Request
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

VIA_TRUSTED_PROXY = "a2a_gate.via_trusted_proxy"


class TrustedProxyMiddleware(ProxyHeadersMiddleware):
    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] in ("http", "websocket"):
            client = scope.get("client")
            if client:
                # a dual-stack listener reports an IPv4 peer as ::ffff:a.b.c.d; a proxy
                # configured as a.b.c.d is that peer
                client = scope["client"] = (unmapped(client[0]), client[1])
            scope[VIA_TRUSTED_PROXY] = bool(client) and client[0] in self.trusted_hosts
        await super().__call__(scope, receive, send)


def unmapped(host: str) -> str:
    """The IPv4 address an IPv4-mapped IPv6 address carries; any other host unchanged."""
    if host[:7].lower() != "::ffff:":
        return host
    try:
        mapped = ipaddress.IPv6Address(host).ipv4_mapped
    except ValueError:
        return host
    return str(mapped) if mapped else host


def public_base_url(request: Request, configured: str) -> str:
    """The configured `public_url`; without one, the proxy's scheme and host, else our own address."""
    if configured:
        return configured
    if request.scope.get(VIA_TRUSTED_PROXY) and request.headers.get("host"):
        return f"{request.url.scheme}://{request.headers['host']}"
    host, port = request.scope.get("server") or ("127.0.0.1", 80)
    return f"http://{host}:{port}"
