"""A response as the proxy reads it: its head, then its body buffered for :meth:`Response.read`
and :meth:`Response.read_all`, or written into the client's transport by :meth:`Response.pipe`.
What fills it in is router.http.h1.exchange.Exchange, from the connection's reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final, cast

from multidict import CIMultiDictProxy

from router.http.h1.bodies import Sink
from router.http.h1.deadlines import HeadWatch
from router.http.h1.errors import ConnectionBroken, HeadTimedOut
from router.http.h1.interfaces import Carrier

BUFFER_HIGH_WATER: Final = 256 * 1024
"""Body bytes held for a consumer that has not taken them before the upstream is not read."""


async def _settled() -> None:
    """What :meth:`Response.head` returns when there is nothing left to wait for."""


class Response:
    """The head first, then the body as it arrives.

    The body is either buffered for :meth:`read` / :meth:`read_all`, or, after :meth:`pipe`,
    written straight from the connection's read callback into the client's transport (no
    await per chunk); the upstream is not read while the client is slower than it."""

    __slots__ = (
        "_loop",
        "_reading",
        "_sink",
        "_waiter",
        "buffered",
        "chunks",
        "conn",
        "done",
        "error",
        "headers",
        "keep_alive",
        "length",
        "reason",
        "status",
        "watch",
    )

    def __init__(self, conn: Carrier) -> None:
        self._loop = conn.loop  # asyncio.get_running_loop() costs a getpid() syscall each time
        self.conn: Carrier | None = conn
        """The connection it arrives on, until it is complete or broken."""
        self._reading = False
        """Someone reads the body (read, read_all, pipe): keep the upstream socket read."""
        self._sink: Sink | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.watch: HeadWatch | None = None
        """The deadline the head is awaited under, if any."""
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDictProxy[str] = cast(CIMultiDictProxy[str], None)
        self.length: int | None = None
        """The response's Content-Length (for HEAD: what a GET would have had)."""
        self.keep_alive = False
        self.chunks: list[bytes] | None = None
        """Body bytes not taken yet (None: none, and no list allocated while a head is awaited)."""
        self.buffered = 0
        self.done = False
        """The whole body has arrived (a body-less response is done with its head)."""
        self.error: BaseException | None = None

    def _body(self, data: bytes | memoryview) -> None:
        sink = self._sink
        if sink is None:
            chunk = bytes(data)  # a view of the read buffer, which is read into again
            if self.chunks is None:
                self.chunks = [chunk]
            else:
                self.chunks.append(chunk)
            self.buffered += len(chunk)
            if self.buffered > BUFFER_HIGH_WATER and self.conn is not None:
                self.conn.pause_reading()
            self._wake()
        elif not sink.write(data, self.conn):
            self.error = ConnectionResetError("the client went away")
            self._close_broken()
        elif sink.paused:
            self._wake()

    def _close_broken(self) -> None:
        """The exchange failed: its connection is closed (and never reused), waiters woken."""
        conn = self.conn
        if conn is not None:
            conn.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        if self.status or self.error is not None:  # the head is in, or will never be
            watch = self.watch
            if watch is not None:
                self.watch = None
                watch.forget(self)

    async def _wait(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None

    def timed_out(self, seconds: float) -> None:
        """The response head did not come in time (from the pool's deadlines)."""
        self.watch = None
        if not self.status and self.error is None:
            self.error = HeadTimedOut(f"no response head within {seconds:g}s")
            self._close_broken()

    # -- for the proxy -----------------------------------------------------------------------

    @property
    def settled(self) -> bool:
        """The response head is in, or will never be: :meth:`head` has nothing to wait for."""
        return bool(self.status) or self.error is not None

    def head(self) -> Awaitable[None]:
        """Wait for the response head; then :meth:`check` says how it went. Not a coroutine:
        a request waiting on a slow upstream keeps no frame of this module."""
        if self.status or self.error is not None:
            return _settled()
        waiter = self._waiter  # nothing else waits before the head
        if waiter is None:
            waiter = self._waiter = self._loop.create_future()
        return waiter

    @property
    def sent(self) -> int:
        """Body bytes written by :meth:`pipe`."""
        return self._sink.sent if self._sink is not None else 0

    def check(self) -> None:
        """Raise what kept the response head from arriving, if anything did."""
        if not self.status:
            raise self.error or ConnectionBroken("no response head yet")

    def take(self) -> bytes:
        """The body bytes buffered so far (the whole body once ``done``)."""
        chunks = self.chunks
        if self.conn is not None and (self._reading or self.buffered > BUFFER_HIGH_WATER):
            self.conn.resume_reading()
        if not chunks:
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = None
        self.buffered = 0
        return data

    async def read(self) -> bytes:
        """The next body bytes, b"" at the end; raises if the upstream broke off."""
        self._reading = True
        while not self.chunks and not self.done and self.error is None:
            if self.conn is not None:
                self.conn.resume_reading()
            await self._wait()
        if self.chunks:
            return self.take()
        if self.error is not None:
            raise self.error
        return b""

    async def read_all(self) -> bytes:
        self._reading = True
        while not self.done and self.error is None:
            if self.conn is not None:
                self.conn.resume_reading()
            await self._wait()
        if self.error is not None:
            raise self.error
        return self.take()

    async def pipe(
        self, transport: asyncio.Transport, chunked: bool, drain: Callable[[], Awaitable[None]]
    ) -> int:
        """Write the rest of the body into ``transport`` as it arrives (chunk-framed when
        ``chunked``); ``drain`` waits until the client has taken enough. Returns bytes written."""
        sink = self._sink = Sink(transport, chunked)
        self._reading = True
        pending = self.take()
        if pending:
            self._body(pending)
        while self.error is None and not self.done:
            if sink.paused:
                await drain()
                sink.paused = False
                if transport.is_closing():
                    raise ConnectionResetError("the client went away")
                if self.conn is not None:
                    self.conn.resume_reading()
                continue
            await self._wait()
        if self.error is not None:
            raise self.error
        return sink.sent
