"""Header rules for forwarding: hop-by-hop stripped, X-Forwarded-* set, Host kept."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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
CLIENT_FORWARDING = frozenset(("forwarded", "x-real-ip"))
"""Forwarding headers warmgate does not write: a client's are dropped unless
``server.trust_forwarded`` (an engine, or a proxy behind warmgate, would believe a forged
client address). ``X-Forwarded-*`` are always written by warmgate (see :func:`_forwarded`)."""
_UNTRUSTED_DROP = HOP_BY_HOP | CLIENT_FORWARDING
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
_RESPONSE_DROP = (*sorted(HOP_BY_HOP), "date")
RESPONSE_SKIP = HOP_BY_HOP | {"date", "server"}
"""aiohttp writes Date and Server itself; the upstream's Server is kept below."""
_BODYLESS_METHODS = frozenset(("GET", "HEAD", "OPTIONS", "TRACE"))
"""Methods that get no ``Content-Length: 0`` when sent without a body (as aiohttp does)."""
_IDEMPOTENT_METHODS = frozenset(("GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"))
"""RFC 9110 9.2.2: a request of these may be sent again when its connection closed before any
answer (the upstream may or may not have acted on it)."""


def _forwarding_alias(lower: str) -> bool:
    """``lower`` spells a forwarding header with underscores (``x_forwarded_for``): WSGI and CGI
    servers read it as the header itself, so it never passes (warmgate writes the real ones)."""
    if "_" not in lower:
        return False
    spelled = lower.replace("_", "-")
    return spelled in CLIENT_FORWARDING or spelled.startswith("x-forwarded-")


def _connection_tokens(headers: CIMultiDictProxy[str]) -> frozenset[str]:
    value = headers.get("Connection")
    if not value:
        return frozenset()
    return frozenset(token.strip().lower() for token in value.split(","))


def _forwarded(
    headers: Mapping[str, str],
    client_ip: str | None,
    scheme: str,
    prefix: str | None,
    trust_forwarded: bool,
) -> list[tuple[str, str]]:
    """The X-Forwarded-* headers warmgate sets (any the client sent are dropped unless trusted)."""
    out = []
    forwarded_for = headers.get("X-Forwarded-For") if trust_forwarded else None
    if client_ip:
        forwarded_for = f"{forwarded_for}, {client_ip}" if forwarded_for else client_ip
    if forwarded_for:
        out.append(("X-Forwarded-For", forwarded_for))
    out.append(
        (
            "X-Forwarded-Proto",
            headers.get("X-Forwarded-Proto", scheme) if trust_forwarded else scheme,
        )
    )
    host = headers.get("Host")
    if trust_forwarded and "X-Forwarded-Host" in headers:
        host = headers["X-Forwarded-Host"]
    if host:
        out.append(("X-Forwarded-Host", host))
    if prefix:
        out.append(("X-Forwarded-Prefix", prefix))
    return out


def upstream_request_head(
    request_line: str,
    headers: CIMultiDictProxy[str],
    *,
    client_ip: str | None,
    scheme: str,
    prefix: str | None,
    trust_forwarded: bool,
    default_host: bytes,
    end: bytes = b"\r\n",
) -> bytes:
    """The request head to send upstream, by the rules of :func:`upstream_request_headers`
    (byte-exact: headers were decoded with ``surrogateescape``). ``default_host`` is sent when
    the client sent no Host; ``end`` ends the head (the body's framing header, if any, and the
    blank line)."""
    tokens = _connection_tokens(headers)
    drop = HOP_BY_HOP if trust_forwarded else _UNTRUSTED_DROP
    if tokens:
        drop = drop | tokens
    parts = [request_line]
    for name, value in headers.items():
        lower = name.lower()
        if lower in drop or lower.startswith("x-forwarded-") or _forwarding_alias(lower):
            continue
        parts.append(f"{name}: {value}\r\n")
    for name, value in _forwarded(headers, client_ip, scheme, prefix, trust_forwarded):
        parts.append(f"{name}: {value}\r\n")
    head = "".join(parts).encode("utf-8", "surrogateescape")
    return head + end if "Host" in headers else head + b"Host: %s\r\n" % default_host + end


def serialize_request_head(
    method: str,
    target: str,
    headers: Mapping[str, str] | CIMultiDict[str],
    default_host: bytes,
    end: bytes = b"\r\n",
) -> bytes:
    """A request head from headers made in code, ended by ``end`` (as above). A header that
    would split the head (CR or LF in a name or value) is a bug: it raises ``ValueError``."""
    parts = [f"{method} {target} HTTP/1.1\r\n"]
    has_host = False
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent: it would split the request head")
        if name.lower() == "host":
            has_host = True
        parts.append(f"{name}: {value}\r\n")
    head = "".join(parts).encode("utf-8", "surrogateescape")
    return head + end if has_host else head + b"Host: %s\r\n" % default_host + end


def idempotent(method: str) -> bool:
    """The method may be sent twice: see :data:`_IDEMPOTENT_METHODS`."""
    return method in _IDEMPOTENT_METHODS


def needs_empty_length(method: str) -> bool:
    """A body-less request of this method gets ``Content-Length: 0`` (some servers want it)."""
    return method not in _BODYLESS_METHODS


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
    and build URLs from it); hop-by-hop headers and those named in Connection are dropped, and
    so are the client's forwarding headers unless trusted."""
    drop = (HOP_BY_HOP if trust_forwarded else _UNTRUSTED_DROP) | _connection_tokens(headers)
    drop |= frozenset(skip)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower in drop or lower.startswith("x-forwarded-") or _forwarding_alias(lower):
            continue
        out.add(name, value)
    for name, value in _forwarded(headers, client_ip, scheme, prefix, trust_forwarded):
        out[name] = value
    return out


def downstream_response_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """Upstream response headers minus hop-by-hop ones; Content-Encoding and Content-Length kept
    exactly (the body is passed through undecoded)."""
    out = CIMultiDict(headers)  # copied in C; the few to drop are then looked up, not scanned
    for name in _RESPONSE_DROP:
        if name in out:
            out.popall(name)
    for name in _connection_tokens(headers):
        out.popall(name, None)
    return out
