"""Where a base URL sends its requests: host, port, TLS, path prefix and Host header, parsed
once per base (a backend's URL or a pod address)."""

from __future__ import annotations

from dataclasses import dataclass

from yarl import URL


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one base URL (``http://host:port[/prefix]``) sends its requests."""

    key: str
    host: str
    port: int
    tls: bool
    prefix: str
    """Path of the base URL, prepended to every request target ("" for none)."""
    host_header: bytes
    """Sent as ``Host`` when the client sent none."""


_ENDPOINTS: dict[str, Endpoint] = {}


def endpoint(base: str) -> Endpoint:
    """The endpoint of a base URL (parsed once; a base is a backend's URL or a pod address)."""
    found = _ENDPOINTS.get(base)
    if found is not None:
        return found
    url = URL(base)
    if url.scheme not in ("http", "https") or not url.host or url.user or url.query_string:
        raise ValueError(f"cannot forward to {base!r}: expected http(s)://host[:port][/path]")
    authority, slash, path = base.split("://", 1)[1].partition("/")
    found = Endpoint(
        key=base,
        host=url.host,
        port=url.port or (443 if url.scheme == "https" else 80),
        tls=url.scheme == "https",
        prefix=slash + path,
        host_header=authority.encode(),
    )
    if len(_ENDPOINTS) >= 4096:  # pod addresses come and go; never grow without bound
        _ENDPOINTS.clear()
    _ENDPOINTS[base] = found
    return found
