"""One upstream TCP connection as an asyncio Protocol: it carries one exchange at a time, hands
it what it reads, and goes back to its pool after a complete response."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol, cast

from router.http.h1.endpoint import Endpoint
from router.http.h1.errors import ConnectionBroken
from router.http.h1.interfaces import Receiver


class Owner(Protocol):
    """What a connection needs of its pool: where to read into, and where to go when idle."""

    @property
    def read_buffer(self) -> bytearray: ...

    @property
    def read_view(self) -> memoryview:
        """All of ``read_buffer``: where a body is read into."""
        ...

    @property
    def head_view(self) -> memoryview:
        """The start of ``read_buffer``: where a response head is read into."""
        ...

    def renew_read_buffer(self) -> None: ...

    def release(self, conn: Connection) -> None:
        """``conn`` completed an exchange and is clean: keep it for the next request."""
        ...

    def forget(self, conn: Connection) -> None:
        """``conn`` is gone."""
        ...


class Connection(asyncio.BufferedProtocol):
    """One upstream TCP connection; carries at most one exchange at a time.

    Reads land in the pool's shared buffer and are consumed before ``buffer_updated`` returns:
    a plain body goes from there straight into the client's socket, so the common case copies
    nothing in user space (see router.http.h1.bodies.Sink)."""

    __slots__ = (
        "_drain",
        "_on_lost",
        "_write_paused",
        "ep",
        "exchange",
        "idle_since",
        "loop",
        "lost",
        "owner",
        "paused",
        "transport",
        "used",
    )

    def __init__(self, owner: Owner, ep: Endpoint, loop: asyncio.AbstractEventLoop) -> None:
        self.owner = owner
        self.ep = ep
        self.loop = loop
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self.exchange: Receiver | None = None
        self.lost = False
        self.used = 0
        """Exchanges this connection carried (a reused one may have been closed meanwhile)."""
        self.idle_since = 0.0
        self.paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._on_lost: asyncio.Future[None] | None = None

    # -- asyncio's side ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        exchange = self.exchange
        if exchange is not None and not exchange.awaiting_head:
            return self.owner.read_view
        return self.owner.head_view

    def buffer_updated(self, nbytes: int) -> None:
        exchange = self.exchange
        if exchange is not None:
            exchange.received(self.owner.read_buffer, nbytes)
        else:  # an idle connection must be silent: whatever this is, it is not ours to read
            self.transport.close()

    def eof_received(self) -> bool:
        exchange = self.exchange
        if exchange is not None:
            exchange.eof_received()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.connection_lost(exc)
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)
        self.owner.forget(self)
        if self._on_lost is not None and not self._on_lost.done():
            self._on_lost.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    # -- the exchange's side (router.http.h1.interfaces.Carrier) ------------------------------

    async def drain(self) -> None:
        while self._write_paused and not self.lost:
            self._drain = self.loop.create_future()
            await self._drain
        if self.lost:
            raise ConnectionBroken("the upstream closed the connection")

    def pause_reading(self) -> None:
        if not self.paused and not self.lost:
            self.paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.paused and not self.lost:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.lost and self.transport is not None:
            self.transport.close()

    def discard(self) -> None:
        self.exchange = None
        self.close()

    def release(self) -> None:
        self.exchange = None
        self.resume_reading()
        self.owner.release(self)

    def renew_read_buffer(self) -> None:
        self.owner.renew_read_buffer()

    # -- the pool's side -----------------------------------------------------------------------

    def carry(self, exchange: Receiver) -> None:
        """``exchange`` is sent on this connection now."""
        self.used += 1
        self.exchange = exchange

    def closed(self) -> Awaitable[None] | None:
        """Close; returns what to await until the connection is gone (None: gone already)."""
        if self.lost or self.transport is None:  # gone, or still connecting (cancelled then)
            return None
        if self._on_lost is None:
            self._on_lost = self.loop.create_future()
        self.transport.close()
        return self._on_lost
