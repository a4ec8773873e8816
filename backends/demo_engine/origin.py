"""ComfyUI's origin check: a browser request whose Origin names another host:port gets 403.

This stops other web pages from driving a local engine through the user's browser (CSRF);
requests without an Origin header (curl, the router's own probes) pass.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def origin_allowed(origin: str | None, host: str | None) -> bool:
    """True when there is no Origin, or its host and port equal the Host header's."""
    if origin is None:
        return True
    parsed = urlsplit(origin.strip())
    default = _DEFAULT_PORTS.get(parsed.scheme.lower())
    if default is None or not parsed.hostname or host is None:
        return False
    target = urlsplit("//" + host.strip())
    try:
        origin_port = parsed.port or default
        host_port = target.port or default
    except ValueError:
        return False
    return (parsed.hostname, origin_port) == (target.hostname, host_port)


@web.middleware
async def origin_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not origin_allowed(request.headers.get(hdrs.ORIGIN), request.headers.get(hdrs.HOST)):
        return web.json_response(
            {"error": {"type": "forbidden_origin", "message": "Origin does not match Host"}},
            status=403,
        )
    return await handler(request)
