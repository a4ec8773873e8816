"""warmgate's own HTTP/1.1 client for forwarded exchanges: keep-alive connections per target on
asyncio Protocols, response heads (and chunked or until-close bodies) parsed by aiohttp's llhttp
parser, bodies handed over as they arrive, with flow control both ways.

Why not ``aiohttp.ClientSession`` on this path: per exchange it cost ~230 us of CPU and ~8 KB per
request in flight on the benchmark machine (request, response, connection and timer objects);
this client costs a fraction of both. Websockets and every other upstream call stay on aiohttp:
:class:`UpstreamConnector` is aiohttp's connector plus this pool, configured and closed together.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, cast

import aiohttp
from aiohttp.http_parser import HttpResponseParser
from multidict import CIMultiDictProxy
from yarl import URL

PARSER_LIMIT: Final = 2**30
"""The parser's own payload buffer never asks to pause: it is drained after every feed."""
BUFFER_HIGH_WATER: Final = 256 * 1024
"""Body bytes held for a consumer that has not taken them before the upstream is not read."""
READ_SIZE: Final = 256 * 1024
"""Bytes read from an upstream socket at a time, into the pool's one read buffer."""
HEAD_READ_SIZE: Final = 16 * 1024
"""Bytes read while a response head is awaited: a small body comes with it; a large one waits
in the socket until the client's response is ready for it, instead of being copied aside."""


class UpstreamFailure(Exception):
    """An exchange with the upstream failed; proxy.py translates it into warmgate's errors."""


class ConnectFailed(UpstreamFailure):
    """The TCP (or TLS) connection could not be opened."""


class ConnectTimedOut(UpstreamFailure, TimeoutError):
    """The connection was not open within the connect timeout."""


class HeadTimedOut(UpstreamFailure, TimeoutError):
    """No response head within the response-headers timeout."""


class ConnectionBroken(UpstreamFailure):
    """The upstream closed, reset, or sent something that is not HTTP/1.x."""


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


class _NoFlowControl:
    """Stands in for aiohttp's protocol inside the parser's payload buffer, which is drained
    right after every feed; flow control is the exchange's own."""

    _reading_paused = False
    connected = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


_NO_FLOW: Final = _NoFlowControl()


async def _settled() -> None:
    """What :meth:`Exchange.head` returns when there is nothing left to wait for."""


_response_parser: Any = HttpResponseParser  # the C (llhttp) parser when aiohttp has it


class _Connection(asyncio.BufferedProtocol):
    """One upstream TCP connection; carries at most one exchange at a time.

    Reads land in the pool's shared buffer and are consumed before ``buffer_updated`` returns:
    a plain body goes from there straight into the client's socket, so the common case copies
    nothing in user space (see :meth:`Exchange._received`)."""

    __slots__ = (
        "_drain",
        "_loop",
        "_on_lost",
        "_write_paused",
        "ep",
        "exchange",
        "idle_since",
        "lost",
        "paused",
        "pool",
        "transport",
        "used",
    )

    def __init__(self, pool: UpstreamPool, ep: Endpoint, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.ep = ep
        self._loop = loop
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self.exchange: Exchange | None = None
        self.lost = False
        self.used = 0
        self.idle_since = 0.0
        self.paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._on_lost: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        exchange = self.exchange
        if exchange is not None and exchange.status:
            return self.pool.read_view
        return self.pool.head_view

    def buffer_updated(self, nbytes: int) -> None:
        exchange = self.exchange
        if exchange is not None:
            exchange._received(self.pool, 0, nbytes)
        else:  # an idle connection must be silent: whatever this is, it is not ours to read
            self.transport.close()

    def eof_received(self) -> bool:
        exchange = self.exchange
        if exchange is not None:
            exchange._feed_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange._lost()
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)
        self.pool._forget(self)
        if self._on_lost is not None and not self._on_lost.done():
            self._on_lost.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drain(self) -> None:
        while self._write_paused and not self.lost:
            self._drain = self._loop.create_future()
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
        if not self.lost:
            self.transport.close()

    def closed(self) -> Awaitable[None] | None:
        """Close; returns what to await until the connection is gone (None: gone already)."""
        if self.lost:
            return None
        if self._on_lost is None:
            self._on_lost = self._loop.create_future()
        self.transport.close()
        return self._on_lost


class _Sink:
    """Where :meth:`Exchange.pipe` writes: the client's transport, and how."""

    __slots__ = ("chunked", "high", "paused", "sent", "transport")

    def __init__(self, transport: asyncio.Transport, chunked: bool, high: int) -> None:
        self.transport = transport
        self.chunked = chunked
        self.high = high
        """Above this many bytes queued in the transport, the upstream is not read."""
        self.paused = False
        self.sent = 0


class Exchange:
    """One request sent and its response: the head first, then the body as it arrives.

    The body is either buffered for :meth:`read` / :meth:`read_all`, or, after :meth:`pipe`,
    written straight from ``data_received`` into the client's transport (no await per chunk);
    the upstream is not read while the client is slower than it."""

    __slots__ = (
        "_body_task",
        "_head_only",
        "_parser",
        "_payload",
        "_reading",
        "_remaining",
        "_reusable",
        "_sink",
        "_waiter",
        "_watch",
        "buffered",
        "chunks",
        "conn",
        "done",
        "error",
        "headers",
        "keep_alive",
        "length",
        "reason",
        "replayable",
        "request_sent",
        "status",
    )

    def __init__(self, conn: _Connection, head_only: bool) -> None:
        self.conn: _Connection | None = conn
        self._head_only = head_only
        self._parser: Any = None
        self._payload: Any = None
        self._remaining = -1
        """Body bytes still expected when framed by Content-Length; -1: the parser frames it."""
        self._reading = False
        """Someone reads the body (read, read_all, pipe): keep the upstream socket read."""
        self._reusable = True
        self._sink: _Sink | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._watch: dict[Exchange, float] | None = None
        """The pool's deadlines this exchange is in while its head is awaited."""
        self._body_task: asyncio.Task[None] | None = None
        self.replayable = False
        """The request can be sent again: no streamed body, on a reused keep-alive connection."""
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
        self.request_sent = False

    # -- from the connection (synchronous, in buffer_updated) -------------------------------

    def _received(self, pool: UpstreamPool, start: int, stop: int) -> None:
        """``pool.read_buffer[start:stop]`` arrived; it must be consumed before returning."""
        view = pool.read_view
        while start < stop and self.error is None:
            if self.done:  # bytes after a complete response: never pipelined, so not HTTP
                self._reusable = False
                if self.conn is not None:
                    self.conn.close()
                return
            remaining = self._remaining
            if remaining >= 0:  # a Content-Length body: no parser, no copy
                end = min(stop, start + remaining)
                self._remaining = remaining - (end - start)
                self._body(view[start:end])
                start = end
                if not self._remaining:
                    self._finish()
            elif not self.status:  # the head: parse it alone, the body may not need the parser
                end = pool.read_buffer.find(b"\r\n\r\n", start, stop)
                end = stop if end < 0 else end + 4
                self._feed(bytes(view[start:end]))
                start = end
            else:  # chunked, or until the connection closes: the parser frames it
                self._feed(bytes(view[start:stop]))
                break
        if self.status and not self.done and not self._reading and self.conn is not None:
            # The rest of the body waits in the socket until read() or pipe() asks for it.
            self.conn.pause_reading()

    def _feed(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:
            parser = self._parser = _response_parser(
                _NO_FLOW,
                asyncio.get_running_loop(),
                PARSER_LIMIT,
                response_with_body=not self._head_only,
                read_until_eof=True,
                auto_decompress=False,
            )
        try:
            messages, _, _ = parser.feed_data(data)
        except Exception as exc:  # HttpProcessingError and friends: not HTTP/1.x
            self._broken(f"the upstream sent an invalid response ({exc})")
            return
        for message, payload in messages:
            if self.status:  # a second response to one request
                self._broken("the upstream sent more than one response")
                return
            if 100 <= message.code < 200 and message.code != 101:
                continue  # informational (100 Continue, 103 Early Hints): the final one follows
            self._head(message, payload)
        self._pull()

    def _head(self, message: Any, payload: Any) -> None:
        length = message.headers.get("Content-Length")
        if length is not None and not message.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self._broken(f"the upstream sent Content-Length {length!r}")
                return
        self.status = message.code
        self.reason = message.reason
        self.headers = message.headers
        self.keep_alive = not message.should_close
        self._payload = payload
        self._wake()

    def _pull(self) -> None:
        """Move what the parser framed into the body; past a Content-Length head, skip it."""
        payload = self._payload
        if payload is None:
            return
        try:
            data = payload.read_nowait(-1)
        except Exception as exc:
            self._broken(f"the upstream sent an invalid body ({exc})")
            return
        if data:
            self._body(data)
        if payload.is_eof():
            self._payload = self._parser = None
            self._finish()
        elif self.length is not None and not self._head_only:
            self._remaining = self.length - payload.total_bytes
            self._payload = self._parser = None

    def _body(self, data: bytes | memoryview) -> None:
        sink = self._sink
        if sink is None:
            if type(data) is memoryview:
                data = bytes(data)
            if self.chunks is None:
                self.chunks = [data]
            else:
                self.chunks.append(data)
            self.buffered += len(data)
            if self.buffered > BUFFER_HIGH_WATER and self.conn is not None:
                self.conn.pause_reading()
            self._wake()
            return
        transport = sink.transport
        if transport.is_closing():
            self.error = ConnectionResetError("the client went away")
            self._reusable = False
            if self.conn is not None:
                self.conn.close()
            self._wake()
            return
        if sink.chunked:
            transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            transport.write(data)
        sink.sent += len(data)
        pending = transport.get_write_buffer_size()
        if pending:
            conn = self.conn
            if type(data) is memoryview and conn is not None:
                conn.pool.renew_read_buffer()  # the transport may keep a view of the old one
            if pending > sink.high and conn is not None:
                conn.pause_reading()
                sink.paused = True
                self._wake()

    def _finish(self) -> None:
        self.done = True
        conn = self.conn
        if conn is not None and self.keep_alive and self._reusable and self.request_sent:
            self.conn = None
            conn.exchange = None
            conn.resume_reading()
            conn.pool._release(conn)
        self._wake()

    def _feed_eof(self) -> None:
        if self.done:
            return
        parser = self._parser
        if parser is not None and self.status:
            try:
                parser.feed_eof()  # ends a body that runs until the connection closes
            except Exception:
                pass
            else:
                self._pull()
                if self.done:
                    return
        self.keep_alive = False
        self._broken(
            "the upstream closed the connection"
            + (" before the end of the body" if self.status else "")
        )

    def _lost(self) -> None:
        self.conn = None
        if not self.done and self.error is None:
            self._feed_eof()
        self._wake()

    def _broken(self, why: str) -> None:
        self._reusable = False
        if self.error is None:
            self.error = ConnectionBroken(why)
        conn = self.conn
        if conn is not None:
            conn.close()
        self._wake()

    def _timed_out(self, seconds: float) -> None:
        if not self.status and self.error is None:
            self.error = HeadTimedOut(f"no response head within {seconds:g}s")
            self._reusable = False
            if self.conn is not None:
                self.conn.close()
            self._wake()

    def _fail_request(self, exc: BaseException) -> None:
        """Sending the request body failed (too large, client gone): this exchange is over."""
        self._reusable = False
        if self.error is None and not self.done:
            self.error = exc
        if self.conn is not None:
            self.conn.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        if self.status or self.error is not None:  # the head is in, or will never be
            watch = self._watch
            if watch is not None:
                self._watch = None
                watch.pop(self, None)

    async def _wait(self) -> None:
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            if self._waiter is waiter:
                self._waiter = None

    # -- the request ------------------------------------------------------------------------

    def _send(
        self,
        transport: asyncio.Transport,
        head: bytes,
        body: bytes | AsyncIterable[bytes] | None,
        chunked: bool,
    ) -> None:
        if body is None:
            transport.write(head)
            self.request_sent = True
        elif isinstance(body, bytes):
            transport.writelines((head, body))
            self.request_sent = True
        else:
            transport.write(head)
            self._body_task = asyncio.get_running_loop().create_task(self._send_body(body, chunked))

    async def _send_body(self, chunks: AsyncIterable[bytes], chunked: bool) -> None:
        conn = self.conn
        assert conn is not None
        transport = conn.transport
        try:
            async for chunk in chunks:
                if conn.lost or self.error is not None:
                    return
                if not chunk:
                    continue
                if chunked:
                    transport.writelines((b"%x\r\n" % len(chunk), chunk, b"\r\n"))
                else:
                    transport.write(chunk)
                await conn.drain()
            if chunked and not conn.lost:
                transport.write(b"0\r\n\r\n")
            self.request_sent = True
            if self.done and self.conn is conn:  # the response ended first: reuse it now
                self._finish()
        except ConnectionBroken:
            pass  # the response side reports what the upstream did
        except Exception as exc:
            self._fail_request(exc)

    # -- for the proxy -----------------------------------------------------------------------

    def head(self) -> Awaitable[None]:
        """Wait for the response head; then :meth:`check` says how it went. Not a coroutine:
        a request waiting on a slow upstream keeps no frame of this module."""
        if self.status or self.error is not None:
            return _settled()
        waiter = self._waiter  # nothing else waits before the head
        if waiter is None:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
        return waiter

    @property
    def got_data(self) -> bool:
        """Some of a response arrived (the parser starts with its first byte)."""
        return bool(self.status) or self._parser is not None or self._remaining >= 0

    @property
    def sent(self) -> int:
        """Body bytes written by :meth:`pipe`."""
        return self._sink.sent if self._sink is not None else 0

    def retryable(self) -> bool:
        """Broken before any byte of a response, on a reused connection: send it again."""
        return self.replayable and not self.got_data and isinstance(self.error, ConnectionBroken)

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
        try:
            high = transport.get_write_buffer_limits()[1]
        except (AttributeError, NotImplementedError):
            high = 64 * 1024
        sink = self._sink = _Sink(transport, chunked, high)
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

    def close(self) -> None:
        """Done with this exchange: its connection goes back to the pool or is closed."""
        task = self._body_task
        if task is not None and not task.done():
            task.cancel()
        if not self.done and self.error is None:
            self.error = ConnectionBroken("the exchange was closed by warmgate")
            self._wake()
        conn = self.conn
        if conn is None:
            return
        self.conn = None
        conn.exchange = None
        conn.close()


class UpstreamPool:
    """Keep-alive connections of one target to its endpoints, at most ``limit`` (0: no limit)."""

    def __init__(self, *, limit: int = 0, keepalive_timeout: float = 30.0) -> None:
        self.limit = limit
        self.keepalive_timeout = keepalive_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[str, collections.deque[_Connection]] = {}
        self._all: set[_Connection] = set()
        """Every connection open or opening; its size is what ``limit`` bounds."""
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._sweep: asyncio.TimerHandle | None = None
        self._heads: dict[float, dict[Exchange, float]] = {}
        """Exchanges waiting for a response head, per timeout, in deadline order."""
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_timer_at = 0.0
        self._tls: ssl.SSLContext | None = None
        self._closed = False
        self.renew_read_buffer()

    def renew_read_buffer(self) -> None:
        """Read into a fresh buffer from now on (a client transport kept a view of the old one:
        it could not send it all at once)."""
        self.read_buffer = bytearray(READ_SIZE)
        self.read_view = memoryview(self.read_buffer)
        self.head_view = self.read_view[:HEAD_READ_SIZE]

    async def open(
        self,
        ep: Endpoint,
        head: bytes,
        body: bytes | AsyncIterable[bytes] | None = None,
        *,
        chunked: bool = False,
        head_only: bool = False,
        connect_timeout: float | None = None,
        head_timeout: float | None = None,
    ) -> Exchange:
        """Send ``head`` (the request line and headers, blank line included) and ``body`` on a
        pooled or new connection; returns once sent (await :meth:`Exchange.head`, then
        :meth:`Exchange.check`). See :meth:`request` for the whole exchange with its retry."""
        if self._closed:
            raise ConnectionBroken("warmgate is shutting down")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        conn = await self._checkout(ep, connect_timeout)
        exchange = Exchange(conn, head_only)
        exchange.replayable = conn.used > 0 and (body is None or isinstance(body, bytes))
        conn.used += 1
        conn.exchange = exchange
        exchange._send(conn.transport, head, body, chunked)
        if head_timeout is not None:
            self._watch(exchange, head_timeout)
        return exchange

    async def request(
        self,
        ep: Endpoint,
        head: bytes,
        body: bytes | AsyncIterable[bytes] | None = None,
        *,
        chunked: bool = False,
        head_only: bool = False,
        connect_timeout: float | None = None,
        head_timeout: float | None = None,
    ) -> Exchange:
        """:meth:`open`, then wait for the response head. A request sent on a reused
        keep-alive connection that the upstream had closed meanwhile (nothing came back) is
        sent again: :meth:`retry`."""
        exchange = await self.open(
            ep,
            head,
            body,
            chunked=chunked,
            head_only=head_only,
            connect_timeout=connect_timeout,
            head_timeout=head_timeout,
        )
        try:
            await exchange.head()
            exchange.check()
        except ConnectionBroken:
            exchange.close()
            if not exchange.retryable():
                raise
            return await self.request(
                ep,
                head,
                body,
                chunked=chunked,
                head_only=head_only,
                connect_timeout=connect_timeout,
                head_timeout=head_timeout,
            )
        except BaseException:
            exchange.close()
            raise
        return exchange

    # -- connections ---------------------------------------------------------------------------

    async def _checkout(self, ep: Endpoint, connect_timeout: float | None) -> _Connection:
        while True:
            idle = self._idle.get(ep.key)
            while idle:
                conn = idle.pop()
                if not conn.lost and not conn.transport.is_closing():
                    return conn
            if not self.limit or len(self._all) < self.limit or self._evict():
                return await self._connect(ep, connect_timeout)
            waiter = cast(asyncio.AbstractEventLoop, self._loop).create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # pass the slot this waiter was given to the next one
                else:
                    waiter.cancel()
                raise
            if self._closed:
                raise ConnectionBroken("warmgate is shutting down")

    async def _connect(self, ep: Endpoint, connect_timeout: float | None) -> _Connection:
        loop = cast(asyncio.AbstractEventLoop, self._loop)
        conn = _Connection(self, ep, loop)
        self._all.add(conn)
        tls: ssl.SSLContext | None = None
        if ep.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(connect_timeout):
                await loop.create_connection(
                    lambda: conn,
                    ep.host,
                    ep.port,
                    ssl=tls,
                    server_hostname=ep.host if tls else None,
                )
        except BaseException as exc:
            self._forget(conn)
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

    def _release(self, conn: _Connection) -> None:
        """A connection whose exchange is complete: keep it for the next request."""
        if self._closed or conn.lost or conn.transport.is_closing():
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

    def _forget(self, conn: _Connection) -> None:
        """The connection is gone (from connection_lost)."""
        if conn in self._all:
            self._all.discard(conn)
            self._wake_one()

    def _evict(self) -> bool:
        """At the limit: close the longest-idle connection of any endpoint to make room."""
        oldest: collections.deque[_Connection] | None = None
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

    # -- response-head deadlines: one timer per pool, not one per request ----------------------

    def _watch(self, exchange: Exchange, timeout: float) -> None:
        loop = self._loop
        assert loop is not None
        deadline = loop.time() + timeout
        waiting = self._heads.get(timeout)
        if waiting is None:
            waiting = self._heads[timeout] = {}
        waiting[exchange] = deadline
        exchange._watch = waiting
        if self._head_timer is None or deadline < self._head_timer_at:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer_at = deadline
            self._head_timer = loop.call_at(deadline, self._expire_heads)

    def _expire_heads(self) -> None:
        loop = cast(asyncio.AbstractEventLoop, self._loop)
        self._head_timer = None
        now = loop.time()
        soonest: float | None = None
        for timeout, waiting in self._heads.items():
            while waiting:
                exchange, deadline = next(iter(waiting.items()))
                if deadline > now:
                    soonest = deadline if soonest is None else min(soonest, deadline)
                    break
                del waiting[exchange]
                exchange._watch = None
                exchange._timed_out(timeout)
        if soonest is not None:
            self._head_timer_at = soonest
            self._head_timer = loop.call_at(soonest, self._expire_heads)

    # -- shutdown ------------------------------------------------------------------------------

    def close(self) -> list[Awaitable[None]]:
        """Close every connection; returns what to await until they are gone."""
        self._closed = True
        for timer in (self._sweep, self._head_timer):
            if timer is not None:
                timer.cancel()
        self._sweep = self._head_timer = None
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        self._idle.clear()
        closing = [conn.closed() for conn in list(self._all)]
        return [waiter for waiter in closing if waiter is not None]


class UpstreamConnector(aiohttp.TCPConnector):
    """aiohttp's connector (websockets, engine probes) plus warmgate's pool for forwarded HTTP
    exchanges: one ``limit`` and one keep-alive timeout each, closed together."""

    def __init__(self, *, limit: int = 100, keepalive_timeout: float = 30.0, **kwargs: Any) -> None:
        super().__init__(limit=limit, keepalive_timeout=keepalive_timeout, **kwargs)
        self.pool = UpstreamPool(limit=limit, keepalive_timeout=keepalive_timeout)

    async def close(self, *, abort_ssl: bool = False) -> None:
        closing = self.pool.close()
        await super().close(abort_ssl=abort_ssl)
        if closing:
            await asyncio.wait([asyncio.ensure_future(c) for c in closing], timeout=5.0)


def pool_of(session: aiohttp.ClientSession) -> UpstreamPool:
    """The forwarding pool of a target's session (made by ``router.app``)."""
    connector = session.connector
    if not isinstance(connector, UpstreamConnector):
        raise TypeError("a target's session must use router.upstream.UpstreamConnector")
    return connector.pool
