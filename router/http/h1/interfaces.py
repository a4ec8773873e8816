"""Where an exchange and the connection that carries it meet: each side's view of the other.
router.http.h1.connection.Connection is a :class:`Carrier`, router.http.h1.exchange.Exchange a
:class:`Receiver`; neither module imports the other (router.http.h1.pool puts them together).
And what the pool is given to send: an :class:`Outbound` (router.http.upstream.UpstreamRequest).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable
from typing import Protocol

from router.http.h1.endpoint import Endpoint


class Carrier(Protocol):
    """What an exchange (its request body, its response body) needs of its connection."""

    @property
    def transport(self) -> asyncio.Transport: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def lost(self) -> bool:
        """The connection is gone."""
        ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    async def drain(self) -> None:
        """Wait until the upstream has taken what was written; raises ``ConnectionBroken`` if
        the connection is gone."""
        ...

    def close(self) -> None:
        """Close it; the exchange hears of it (``connection_lost``)."""
        ...

    def discard(self) -> None:
        """The exchange is done with it, unfinished: closed without telling the exchange."""
        ...

    def release(self) -> None:
        """The exchange is done with it, complete: it may carry the next one."""
        ...

    def renew_read_buffer(self) -> None:
        """Read into a fresh buffer from now on: a client transport kept a view of the one
        read into, as it could not send all of it at once."""
        ...


class Receiver(Protocol):
    """What a connection needs of the exchange it carries: where reads and the end go."""

    @property
    def awaiting_head(self) -> bool:
        """No response head yet: read a little (a large body can wait in the socket)."""
        ...

    def received(self, buffer: bytearray, nbytes: int) -> None:
        """``buffer[:nbytes]`` arrived; consumed (or copied) before this returns."""
        ...

    def eof_received(self) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone: closed (``exc`` None: after ``eof_received``, or closed
        here) or reset."""
        ...


class Outbound(Protocol):
    """A request as the pool sends it, as often as it is sent."""

    @property
    def ep(self) -> Endpoint: ...

    @property
    def head(self) -> bytes:
        """The request line and headers, blank line included."""
        ...

    @property
    def body(self) -> bytes | AsyncIterable[bytes] | None: ...

    @property
    def chunked(self) -> bool:
        """A streamed ``body`` goes chunk-framed."""
        ...

    @property
    def head_only(self) -> bool:
        """A HEAD request: its response has no body, whatever its headers say."""
        ...

    @property
    def idempotent(self) -> bool:
        """Its method may be sent twice (RFC 9110 9.2.2)."""
        ...

    @property
    def connect_timeout(self) -> float | None:
        """Bounds the wait for a free connection (at the pool's limit) and the connect
        together."""
        ...

    @property
    def head_timeout(self) -> float | None:
        """Bounds the wait for the response head, from when the request (its body too) was
        sent."""
        ...
