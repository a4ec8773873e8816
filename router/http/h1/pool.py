"""warmgate's own HTTP/1.1 client for forwarded exchanges: keep-alive connections per target
(router.http.h1.connection), one exchange at a time on each (router.http.h1.exchange), its
response framed sans-IO (router.http.h1.framer). This module puts them together: the pool,
its limit, idle connections and response-head deadlines.

Why not ``aiohttp.ClientSession`` on this path: per exchange it cost ~230 us of CPU and ~8 KB per
request in flight on the benchmark machine (request, response, connection and timer objects);
this client costs a fraction of both. Websockets and every other upstream call stay on aiohttp:
router.http.h1.connector.UpstreamConnector is aiohttp's connector plus this pool.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from typing import Final, cast

from router.http.h1.connection import Connection
from router.http.h1.deadlines import HeadDeadlines
from router.http.h1.endpoint import Endpoint, endpoint
from router.http.h1.errors import (
    ConnectFailed,
    ConnectionBroken,
    ConnectTimedOut,
    HeadTimedOut,
    UpstreamFailure,
)
from router.http.h1.exchange import Exchange
from router.http.h1.interfaces import Outbound

__all__ = [
    "ConnectFailed",
    "ConnectTimedOut",
    "ConnectionBroken",
    "Endpoint",
    "Exchange",
    "HeadTimedOut",
    "Outbound",
    "UpstreamFailure",
    "UpstreamPool",
    "endpoint",
]

READ_SIZE: Final = 1024 * 1024
"""Bytes read from an upstream socket at a time, into the pool's one read buffer. 1 MiB reads
a typical image in one go (~6% less CPU than 256 KiB on 1 MiB bodies); a client too slow to
take a read at once keeps that buffer until it has (at most one per slow client: what follows
is queued as copies, and the upstream is not read past the transport's high-water mark)."""
HEAD_READ_SIZE: Final = 16 * 1024
"""Bytes read while a response head is awaited: a small body comes with it; a large one waits
in the socket until the client's response is ready for it, instead of being copied aside."""


class UpstreamPool:
    """Keep-alive connections of one target to its endpoints, at most ``limit`` (0: no limit)
    together with the connections opened elsewhere that :meth:`reserve` counted.

    ``keepalive_timeout``: seconds an idle connection is kept (0: none is). ``queued``: the
    block a request waits for a connection in (at the limit): it counts as held meanwhile."""

    def __init__(
        self,
        *,
        limit: int = 0,
        keepalive_timeout: float = 4.0,
        queued: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
    ) -> None:
        self.limit = limit
        self.keepalive_timeout = keepalive_timeout
        self.queued = queued or contextlib.nullcontext
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[str, collections.deque[Connection]] = {}
        self._all: set[Connection] = set()
        """Every connection open or opening; with ``_reserved``, what ``limit`` bounds."""
        self._reserved = 0
        """Connections opened elsewhere (aiohttp's: websockets, engine calls), counted here."""
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._sweep: asyncio.TimerHandle | None = None
        self._deadlines = HeadDeadlines()
        self._tls: ssl.SSLContext | None = None
        self._closed = False
        self.renew_read_buffer()

    def renew_read_buffer(self) -> None:
        """Read into a fresh buffer from now on (a client transport kept a view of the old one:
        it could not send it all at once)."""
        self.read_buffer = bytearray(READ_SIZE)
        self.read_view = memoryview(self.read_buffer)
        self.head_view = self.read_view[:HEAD_READ_SIZE]

    async def open(self, request: Outbound) -> Exchange:
        """Send ``request`` on a pooled or new connection; returns once sent (await
        :meth:`Exchange.head`, then :meth:`Exchange.check`). Sending it again when its reused
        connection turns out closed is the caller's (router.http.upstream.UpstreamRequest):
        only an idempotent request, without a streamed body, on a reused connection is
        ``replayable``."""
        if self._closed:
            raise ConnectionBroken("warmgate is shutting down")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        conn = await self._checkout(request.ep, request.connect_timeout)
        return self._send(conn, request)

    def send_now(self, request: Outbound) -> Exchange | None:
        """:meth:`open` on a kept-alive connection at hand, without an await (no coroutine for
        the common case); None when there is none: :meth:`open` then."""
        if self._closed:
            return None
        conn = self._idle_connection(request.ep.key)
        return None if conn is None else self._send(conn, request)

    def _send(self, conn: Connection, request: Outbound) -> Exchange:
        exchange = Exchange(conn, request.head_only)
        body = request.body
        exchange.replayable = (
            request.idempotent and conn.used > 0 and (body is None or isinstance(body, bytes))
        )
        conn.carry(exchange)
        exchange.send(request.head, body, request.chunked)
        head_timeout = request.head_timeout
        if head_timeout is not None:
            exchange.time_head(self._deadlines, head_timeout)
        return exchange

    # -- connections ---------------------------------------------------------------------------

    async def _checkout(self, ep: Endpoint, connect_timeout: float | None) -> Connection:
        deadline: float | None = None
        while True:
            conn = self._idle_connection(ep.key)
            if conn is not None:
                return conn
            if self._has_room():
                return await self._connect(ep, connect_timeout, deadline)
            if deadline is None and connect_timeout is not None:
                deadline = cast(asyncio.AbstractEventLoop, self._loop).time() + connect_timeout
            with self.queued():
                await self._wait_for_room(ep.key, deadline)

    def _idle_connection(self, key: str) -> Connection | None:
        """A kept-alive connection to ``key`` that is still open, taken from the idle ones."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.lost and not conn.transport.is_closing():
                return conn
        return None

    def _has_room(self) -> bool:
        """A connection may be opened now (the longest idle one closed for it, if need be)."""
        limit = self.limit
        return not limit or len(self._all) + self._reserved < limit or self._evict()

    async def _wait_for_room(self, key: str, deadline: float | None) -> None:
        """Wait until a connection is given back or closed, up to ``deadline`` (loop time);
        callers wait in a ``queued`` block."""
        waiter = cast(asyncio.AbstractEventLoop, self._loop).create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._wake_one()  # pass the slot this waiter was given to the next one
            else:
                waiter.cancel()
            if isinstance(exc, TimeoutError):
                raise ConnectTimedOut(
                    f"no free connection to {key} in time ({self.limit} in use)"
                ) from exc
            raise
        if self._closed:
            raise ConnectionBroken("warmgate is shutting down")

    async def reserve(self, connect_timeout: float | None) -> None:
        """Count a connection opened elsewhere (aiohttp's) against ``limit``, waiting for room
        as a request does (raises ``ConnectTimedOut``); :meth:`unreserve` when it is closed."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        deadline: float | None = None
        while not self._has_room():
            if deadline is None and connect_timeout is not None:
                deadline = self._loop.time() + connect_timeout
            with self.queued():
                await self._wait_for_room("the target", deadline)
        self._reserved += 1

    def unreserve(self) -> None:
        """A connection :meth:`reserve` counted is closed."""
        self._reserved -= 1
        self._wake_one()

    async def _connect(
        self, ep: Endpoint, connect_timeout: float | None, deadline: float | None
    ) -> Connection:
        """Open a connection within ``connect_timeout``, and by ``deadline`` (loop time) when
        a wait for room took some of it."""
        loop = cast(asyncio.AbstractEventLoop, self._loop)
        if connect_timeout is not None:
            start_by = loop.time() + connect_timeout
            deadline = start_by if deadline is None else min(deadline, start_by)
        conn = Connection(self, ep, loop)
        self._all.add(conn)
        tls: ssl.SSLContext | None = None
        if ep.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout_at(deadline):
                await loop.create_connection(
                    lambda: conn,
                    ep.host,
                    ep.port,
                    ssl=tls,
                    server_hostname=ep.host if tls else None,
                )
        except BaseException as exc:
            self.forget(conn)
            if isinstance(exc, TimeoutError):
                raise ConnectTimedOut(f"no connection to {ep.key} in time") from exc
            if isinstance(exc, OSError):
                raise ConnectFailed(f"cannot connect to {ep.key}: {exc}") from exc
            raise
        if self._closed or conn.lost:
            conn.close()
            raise ConnectionBroken(
                "warmgate is shutting down" if self._closed else "closed at once"
            )
        return conn

    def release(self, conn: Connection) -> None:
        """A connection whose exchange is complete: keep it for the next request (for
        ``keepalive_timeout``)."""
        if self._closed or conn.lost or conn.transport.is_closing() or self.keepalive_timeout <= 0:
            conn.close()
            return
        loop = self._loop
        assert loop is not None
        conn.idle_since = loop.time()
        idle = self._idle.get(conn.ep.key)
        if idle is None:
            idle = self._idle[conn.ep.key] = collections.deque()
        idle.append(conn)
        if self._sweep is None:
            self._sweep = loop.call_later(self.keepalive_timeout, self._sweep_idle)
        self._wake_one()

    def forget(self, conn: Connection) -> None:
        """The connection is gone (from connection_lost)."""
        if conn in self._all:
            self._all.discard(conn)
            self._wake_one()

    def _evict(self) -> bool:
        """At the limit: close the longest-idle connection of any endpoint to make room."""
        oldest: collections.deque[Connection] | None = None
        for idle in self._idle.values():
            while idle and idle[0].lost:
                idle.popleft()
            if idle and (oldest is None or idle[0].idle_since < oldest[0].idle_since):
                oldest = idle
        if oldest is None:
            return False
        conn = oldest.popleft()
        self._all.discard(conn)
        conn.close()
        return True

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _sweep_idle(self) -> None:
        loop = cast(asyncio.AbstractEventLoop, self._loop)
        self._sweep = None
        expired = loop.time() - self.keepalive_timeout
        oldest: float | None = None
        for key, idle in list(self._idle.items()):
            while idle and (idle[0].lost or idle[0].idle_since <= expired):
                idle.popleft().close()
            if idle:
                since = idle[0].idle_since
                oldest = since if oldest is None else min(oldest, since)
            else:
                del self._idle[key]
        if oldest is not None:
            self._sweep = loop.call_at(oldest + self.keepalive_timeout, self._sweep_idle)

    # -- shutdown ------------------------------------------------------------------------------

    def close(self) -> list[Awaitable[None]]:
        """Close every connection; returns what to await until they are gone."""
        self._closed = True
        self._deadlines.close()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        self._idle.clear()
        closing = [conn.closed() for conn in list(self._all)]
        return [waiter for waiter in closing if waiter is not None]
