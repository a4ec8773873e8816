"""Header rules for forwarding: hop-by-hop stripped, X-Forwarded-* set, Host kept."""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)
WEBSOCKET_HANDSHAKE = frozenset(
    h.lower()
    for h in (
        "Sec-WebSocket-Key",
        "Sec-WebSocket-Version",
        "Sec-WebSocket-Extensions",
        "Sec-WebSocket-Protocol",
        "Sec-WebSocket-Accept",
    )
)
RESPONSE_SKIP = HOP_BY_HOP | {"date", "server"}
"""aiohttp writes Date and Server itself; the upstream's Server is kept below."""


def _connection_tokens(headers: CIMultiDictProxy[str]) -> frozenset[str]:
    value = headers.get("Connection")
    if not value:
        return frozenset()
    return frozenset(token.strip().lower() for token in value.split(","))


def upstream_request_headers(
    headers: CIMultiDictProxy[str],
    *,
    client_ip: str | None,
    scheme: str,
    prefix: str | None,
    trust_forwarded: bool,
    skip: Iterable[str] = (),
) -> CIMultiDict[str]:
    """Headers to send upstream. Host passes through unchanged (engines check Origin against it
    and build URLs from it); hop-by-hop headers and those named in Connection are dropped."""
    drop = HOP_BY_HOP | _connection_tokens(headers) | frozenset(skip)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower in drop or lower.startswith("x-forwarded-"):
            continue
        out.add(name, value)
    forwarded_for = headers.get("X-Forwarded-For") if trust_forwarded else None
    if client_ip:
        forwarded_for = f"{forwarded_for}, {client_ip}" if forwarded_for else client_ip
    if forwarded_for:
        out["X-Forwarded-For"] = forwarded_for
    out["X-Forwarded-Proto"] = (
        headers.get("X-Forwarded-Proto", scheme) if trust_forwarded else scheme
    )
    host = headers.get("Host")
    if trust_forwarded and "X-Forwarded-Host" in headers:
        host = headers["X-Forwarded-Host"]
    if host:
        out["X-Forwarded-Host"] = host
    if prefix:
        out["X-Forwarded-Prefix"] = prefix
    return out


def downstream_response_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """Upstream response headers minus hop-by-hop ones; Content-Encoding and Content-Length kept
    exactly (the body is passed through undecoded)."""
    drop = HOP_BY_HOP | _connection_tokens(headers)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() in drop or name.lower() == "date":
            continue
        out.add(name, value)
    return out
