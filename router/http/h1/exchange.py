"""One exchange with an upstream: a request sent on one keep-alive connection, and its response
as it arrives. The response is framed by router.http.h1.framer (sans-IO) and read by the proxy
as a router.http.h1.response.Response; the connection is known only as a
:class:`~router.http.h1.interfaces.Carrier`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable

from router.http.h1.bodies import send_body
from router.http.h1.deadlines import HeadDeadlines
from router.http.h1.errors import ConnectionBroken
from router.http.h1.framer import Data, End, FramingError, Head, ResponseFramer
from router.http.h1.interfaces import Carrier
from router.http.h1.response import Response

__all__ = ["Exchange"]


class Exchange(Response):
    """One request sent and its response, fed by the connection's reads (see
    :class:`~router.http.h1.interfaces.Receiver`) as they arrive."""

    __slots__ = ("_body_task", "_framer", "_head_timer", "replayable", "request_sent")

    def __init__(self, conn: Carrier, head_only: bool) -> None:
        super().__init__(conn)
        self._framer = ResponseFramer(head_only)
        self._body_task: asyncio.Task[None] | None = None
        self._head_timer: tuple[HeadDeadlines, float] | None = None
        """The head deadline to start once a streamed request body is sent."""
        self.replayable = False
        """The request can be sent again if the connection turns out closed: an idempotent
        method (RFC 9110 9.2.2), no streamed body, on a reused keep-alive connection."""
        self.request_sent = False

    # -- the request ------------------------------------------------------------------------

    def send(self, head: bytes, body: bytes | AsyncIterable[bytes] | None, chunked: bool) -> None:
        """Write the request: ``head`` (blank line included), then ``body``, streamed in a
        task of its own when it is not bytes."""
        conn = self.conn
        assert conn is not None
        transport = conn.transport
        if body is None:
            transport.write(head)
            self.request_sent = True
        elif isinstance(body, bytes):
            transport.writelines((head, body))
            self.request_sent = True
        else:
            transport.write(head)
            self._body_task = self._loop.create_task(send_body(self, conn, body, chunked))

    def time_head(self, deadlines: HeadDeadlines, timeout: float) -> None:
        """Time the response head out ``timeout`` seconds after the request is sent: now, or
        once its streamed body is (an upload as slow as its client is no slow upstream)."""
        if self.request_sent:
            self.watch = deadlines.watch(self, timeout, self._loop)
        else:
            self._head_timer = (deadlines, timeout)

    def body_sent(self) -> None:
        self.request_sent = True
        timer = self._head_timer
        if timer is not None:
            self._head_timer = None
            if not self.status and self.error is None:
                self.watch = timer[0].watch(self, timer[1], self._loop)
        if self.done and self.conn is not None:  # the response ended first: reuse it now
            self._finish()

    def body_failed(self, exc: BaseException) -> None:
        if self.error is None and not self.done:
            self.error = exc
        self._close_broken()

    # -- from the connection (synchronous, in buffer_updated) -------------------------------

    @property
    def awaiting_head(self) -> bool:
        return not self.status

    def received(self, buffer: bytearray, nbytes: int) -> None:
        if self.error is not None:
            return
        try:
            events = self._framer.feed(buffer, 0, nbytes)
        except FramingError as exc:
            self._broken(f"the upstream sent an invalid response ({exc})")
            return
        for event in events:
            if self.error is not None:
                return
            if type(event) is Data:
                self._body(event.data)
            elif type(event) is Head:
                self._head(event)
            elif type(event) is End:
                self._finish()
            # Informational heads (100 Continue, 103 Early Hints): the final head follows.
        if self.status and not self.done and not self._reading and self.conn is not None:
            # The rest of the body waits in the socket until read() or pipe() asks for it.
            self.conn.pause_reading()

    def eof_received(self) -> None:
        if self.done:
            return
        try:
            events = self._framer.feed_eof()
        except FramingError:
            self.keep_alive = False
            self._broken(
                "the upstream closed the connection"
                + (" before the end of the body" if self.status else "")
            )
            return
        if events:  # the connection's end is the body's
            self._finish()

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn = None
        if not self.done and self.error is None:
            if exc is None:
                self.eof_received()
            else:  # a reset: even a body that ends with the connection is cut off
                self.keep_alive = False
                self._broken(f"the upstream reset the connection ({exc})")
        self._wake()

    # -- the response -------------------------------------------------------------------------

    def _head(self, head: Head) -> None:
        if head.status == 101:
            # An exchange carries requests that asked for no upgrade (websockets go elsewhere):
            # what follows a 101 is no HTTP, and the client must not see one.
            self.keep_alive = False
            self._broken("the upstream switched protocols for a request that asked for no upgrade")
            return
        self.status = head.status
        self.reason = head.reason
        headers = self.headers = head.headers
        self.length = head.length
        self.keep_alive = head.keep_alive
        if head.framing == "chunked" or headers.get("Content-Type", "").startswith(
            "text/event-stream"
        ):
            # Many small pieces, or latency matters more than a copy: keep reading rather than
            # leaving what follows the head in the socket until it is asked for.
            self._reading = True
        self._wake()

    def _finish(self) -> None:
        self.done = True
        conn = self.conn
        if (
            conn is not None
            and self.error is None
            and self.keep_alive
            and not self._framer.must_close
            and self.request_sent
        ):
            self.conn = None
            conn.release()
        self._wake()

    def _broken(self, why: str) -> None:
        if self.error is None:
            self.error = ConnectionBroken(why)
        self._close_broken()

    # -- for the proxy -----------------------------------------------------------------------

    @property
    def got_data(self) -> bool:
        """Some of a response arrived."""
        return self._framer.started

    def retryable(self) -> bool:
        """Broken before any byte of a response on a reused connection (the upstream closed
        it meanwhile), or answered with bytes no response starts with (the leftovers of the
        last response on it), and the request may be sent again: send it again."""
        return (
            self.replayable
            and isinstance(self.error, ConnectionBroken)
            and (not self.got_data or self._framer.stray)
        )

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
        conn.discard()
