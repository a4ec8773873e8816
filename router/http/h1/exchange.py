"""One exchange with an upstream: a request sent on one keep-alive connection, and its response
as it arrives. Heads (and chunked bodies) are parsed by aiohttp's llhttp parser; a plain body is
counted, and either buffered for the proxy or written from the socket callback straight into
the client's transport. The connections and their pool are router.http.h1.pool's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, cast

from aiohttp.http_parser import HttpResponseParser
from multidict import CIMultiDictProxy

if TYPE_CHECKING:
    from router.http.h1.pool import UpstreamPool, _Connection

PARSER_LIMIT: Final = 2**30
"""The parser's own payload buffer never asks to pause: it is drained after every feed."""
BUFFER_HIGH_WATER: Final = 256 * 1024
"""Body bytes held for a consumer that has not taken them before the upstream is not read."""
_UNTIL_CLOSE: Final = -2
_MAX_HEAD: Final = 64 * 1024


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
        "_head_part",
        "_loop",
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
        self._loop = conn._loop  # asyncio.get_running_loop() costs a getpid() syscall each time
        self.conn: _Connection | None = conn
        self._head_only = head_only
        self._parser: Any = None
        self._payload: Any = None
        self._remaining = -1
        """Body bytes still expected when framed by Content-Length; -1: none known yet, or
        chunked (the parser frames it); ``_UNTIL_CLOSE``: the body ends with the connection."""
        self._head_part: bytes | None = None
        """The start of a head that came in pieces."""
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
        buffer: bytes | bytearray = pool.read_buffer
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
            elif remaining == _UNTIL_CLOSE:
                self._body(view[start:stop])
                break
            elif self.status:  # chunked: the parser frames it
                self._feed(bytes(view[start:stop]))
                break
            else:  # a head; the body that follows may not need the parser at all
                part = self._head_part
                if part is not None:  # the head came in pieces (rare): join them
                    buffer = part + bytes(view[start:stop])
                    view = memoryview(buffer)
                    start, stop, self._head_part = 0, len(buffer), None
                end = buffer.find(b"\r\n\r\n", start, stop)
                if end < 0:
                    if stop - start > _MAX_HEAD:
                        self._broken("the upstream sent a response head over 64 KiB")
                        return
                    self._head_part = bytes(view[start:stop])
                    break
                self._parse_head(bytes(view[start : end + 4]))
                start = end + 4
        if self.status and not self.done and not self._reading and self.conn is not None:
            # The rest of the body waits in the socket until read() or pipe() asks for it.
            self.conn.pause_reading()

    def _parse_head(self, head: bytes) -> None:
        """One complete response head. A body is framed by the parser only when chunked."""
        framed = not self._head_only and b"transfer-encoding" in head.lower()
        parser = _response_parser(
            _NO_FLOW,
            self._loop,
            PARSER_LIMIT,
            response_with_body=framed,
            read_until_eof=True,
            auto_decompress=False,
        )
        try:
            messages, _, _ = parser.feed_data(head)
        except Exception as exc:  # HttpProcessingError and friends: not HTTP/1.x
            self._broken(f"the upstream sent an invalid response ({exc})")
            return
        if not messages:  # a head must be complete by its blank line
            self._broken("the upstream sent an incomplete response head")
            return
        message, payload = messages[0]
        code = message.code
        if 100 <= code < 200 and code != 101:
            return  # informational (100 Continue, 103 Early Hints): the final head follows
        length = message.headers.get("Content-Length")
        if length is not None and not message.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self._broken(f"the upstream sent Content-Length {length!r}")
                return
        self.status = code
        self.reason = message.reason
        self.headers = message.headers
        self.keep_alive = not message.should_close
        if message.chunked or message.headers.get("Content-Type", "").startswith(
            "text/event-stream"
        ):
            # Parsed (so copied) anyway, or latency matters more than a copy: keep reading
            # rather than leaving what follows the head in the socket until it is asked for.
            self._reading = True
        if code == 101:  # switched to another protocol: nothing more of ours on it
            self.keep_alive = False
        if self._head_only or code in (204, 304) or code < 200:
            self._finish()  # no body, whatever the headers say
        elif message.chunked:
            self._parser, self._payload = parser, payload
        elif self.length is not None:
            self._remaining = self.length
            if not self.length:
                self._finish()
        else:  # neither length nor chunks: the body ends when the connection does
            self._remaining = _UNTIL_CLOSE
            self.keep_alive = False
        self._wake()

    def _feed(self, data: bytes) -> None:
        """Chunked body bytes, through the parser that framed the head."""
        try:
            self._parser.feed_data(data)
        except Exception as exc:
            self._broken(f"the upstream sent an invalid chunked body ({exc})")
            return
        self._pull()

    def _pull(self) -> None:
        """Move what the parser framed into the body."""
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
        view = type(data) is memoryview
        if view and transport.get_write_buffer_size():
            data = bytes(data)  # it would be queued: queue a copy, not the read buffer
            view = False
        if sink.chunked:
            transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            transport.write(data)
        sink.sent += len(data)
        pending = transport.get_write_buffer_size()
        if pending:
            conn = self.conn
            if view and conn is not None:
                # The transport keeps a view of the read buffer until it sent the rest (one
                # buffer per slow client at most, see above): read into a fresh one.
                conn.pool.renew_read_buffer()
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
        if self._remaining == _UNTIL_CLOSE:
            self._finish()  # the connection's end is the body's
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
        waiter = self._waiter = self._loop.create_future()
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
            self._body_task = self._loop.create_task(self._send_body(body, chunked))

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
            waiter = self._waiter = self._loop.create_future()
        return waiter

    @property
    def got_data(self) -> bool:
        """Some of a response arrived (the parser starts with its first byte)."""
        return bool(self.status) or self._head_part is not None

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
