"""Upstream failures translated into warmgate's errors (router.errors), counted on the way:
warmgate's own client's (router.http.h1.errors) and aiohttp's (websockets)."""

from __future__ import annotations

import aiohttp

from router.errors import UpstreamError, UpstreamTimeout
from router.http.h1.errors import ConnectFailed, ConnectTimedOut
from router.http.runtime import Runtime

_CLOSED_WHEN = {
    "headers": "before its response headers",
    "body": "in the middle of its response body",
    "to the websocket upgrade": "before answering the websocket upgrade",
}
"""A connection closed in each ``phase``, in words."""


def translate(exc: BaseException, runtime: Runtime, phase: str) -> Exception:
    """The error to raise ``from exc``; ``phase``: what did not come ("headers", "body", "to the
    websocket upgrade")."""
    name = runtime.name
    if isinstance(exc, TimeoutError):
        connecting = isinstance(exc, ConnectTimedOut | aiohttp.ConnectionTimeoutError)
        kind = "connect_timeout" if connecting else "timeout"
        runtime.metrics.upstream_errors.labels(name, kind).inc()
        if connecting:
            return UpstreamTimeout(f"could not connect to target {name!r} in time", target=name)
        return UpstreamTimeout(f"target {name!r} sent no response {phase} in time", target=name)
    connect = isinstance(exc, ConnectFailed | aiohttp.ClientConnectorError)
    runtime.metrics.upstream_errors.labels(name, "connect" if connect else "reset").inc()
    if connect:
        return UpstreamError(f"target {name!r} refused the connection", target=name)
    when = _CLOSED_WHEN.get(phase, f"({phase})")
    return UpstreamError(f"target {name!r} closed the connection {when}", target=name)
