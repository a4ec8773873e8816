"""One request to a target's upstream, from its first send to its response head: the head and
the body (streamed, never read whole), the target's timeouts, and the idempotent request sent
again when the keep-alive connection it went on turns out closed. Sent through the target's
pool (router.http.h1.pool); its failures come out translated (router.http.failures).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from typing import Any, Final

import aiohttp
from aiohttp import web

from router.errors import BodyTooLarge
from router.http.failures import translate
from router.http.h1.connector import pool_of
from router.http.h1.pool import Endpoint, Exchange, UpstreamFailure
from router.http.headers import idempotent, needs_empty_length
from router.http.runtime import Runtime

__all__ = ["RequestBody", "UpstreamRequest", "request_body"]

_CHUNKED: Final = b"Transfer-Encoding: chunked\r\n\r\n"
_EMPTY_LENGTH: Final = b"Content-Length: 0\r\n\r\n"

RequestBody = bytes | AsyncIterator[bytes] | None
"""What follows a request head: bytes, a stream of chunks, or nothing."""


class UpstreamRequest(Generator[Any, None, Exchange]):
    """A request to ``ep``, awaited once for its exchange with the response head in (the caller
    reads the body, then closes it); raises warmgate's errors (router.errors).

    ``head``: the request line and headers, given how the head ends (the body's framing header,
    if any, and the blank line: :func:`request_body`). ``body``: one already read instead of the
    request's own (the OpenAI API reads JSON to place it).

    Sent again when the reused keep-alive connection it went on turns out closed by the
    upstream meanwhile (nothing came back, or only the leftovers of the last response on it:
    ``Exchange.retryable``), if its method is idempotent (RFC 9110 9.2.2) and its body is not
    streamed (not at hand a second time); each time on another connection, a new one at the
    latest, and a request on a new connection is never sent again.

    Awaited without a frame of its own: a held request costs what its frames do, and thousands
    may wait on their upstream's head at once (loadtests' "held" section). So it is its own
    awaitable, stepping the pool's send, then the exchange's head, then again if need be."""

    __slots__ = (
        "_exchange",
        "_sending",
        "body",
        "chunked",
        "ep",
        "head",
        "head_only",
        "head_timeout",
        "idempotent",
        "pool",
        "runtime",
    )

    def __init__(
        self,
        request: web.Request,
        runtime: Runtime,
        session: aiohttp.ClientSession,
        ep: Endpoint,
        head: Callable[[bytes], bytes],
        body: bytes | None = None,
    ) -> None:
        self.body, self.chunked, end = request_body(request, runtime, body)
        self.head = head(end)
        method = request.method
        # What the pool reads of it (router.http.h1.interfaces.Outbound) on every send: values,
        # not properties (the pool's hot path).
        self.head_only = method == "HEAD"
        self.idempotent = idempotent(method)
        self.head_timeout: float | None = runtime.spec.timeouts.response_headers
        self.runtime = runtime
        self.pool = pool_of(session)
        self.ep = ep
        self._sending: Coroutine[Any, Any, Exchange] | None = None
        """The pool's send, while it runs."""
        self._exchange: Exchange | None = None
        """Sent, its response head awaited."""

    @property
    def connect_timeout(self) -> float | None:
        """Read only when no kept-alive connection is at hand."""
        return self.runtime.spec.timeouts.connect

    # -- awaited ----------------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Exchange]:
        return self

    def __next__(self) -> Any:
        """A step of the awaiting task: the request is sent (at once on a kept-alive connection
        at hand, else the pool's send goes on), or its response head is in (the task is woken
        when the future it waited on is done)."""
        while True:
            exchange = self._exchange
            if exchange is None:  # to send
                if self._sending is None:
                    exchange = self.pool.send_now(self)
                if exchange is None:
                    sending = self._sending
                    if sending is None:
                        sending = self._sending = self.pool.open(self)
                    try:
                        return sending.send(None)
                    except StopIteration as sent:
                        exchange = sent.value
                    except UpstreamFailure as exc:
                        raise self._failed(exc) from exc
                    except BaseException:
                        self._close()
                        raise
                exchange = self._sent(exchange)
            if not exchange.settled:  # the head: the task waits on the exchange's future
                return next(exchange.head().__await__())
            if not exchange.retryable():
                break
            exchange.close()  # a keep-alive connection closed meanwhile: again, on another
            self._exchange = None
        try:
            exchange.check()
        except UpstreamFailure as exc:
            raise self._failed(exc) from exc
        self._exchange = None
        raise StopIteration(exchange)

    def send(self, value: None) -> Any:
        return self.__next__()

    def throw(self, typ: Any, val: Any = None, tb: Any = None, /) -> Any:
        """What the awaiting task is told (its cancellation) goes to the pool's send while it
        runs; while the head is awaited, the exchange is closed."""
        exc = typ if val is None else val
        sending = self._sending
        if self._exchange is not None or sending is None:
            self._close()
            raise exc
        try:
            yielded = sending.throw(exc)
        except StopIteration as sent:
            self._sent(sent.value)
            return self.__next__()
        except UpstreamFailure as failure:
            raise self._failed(failure) from failure
        except BaseException:
            self._close()
            raise
        return yielded

    def _sent(self, exchange: Exchange) -> Exchange:
        self._sending = None
        self._exchange = exchange
        if not exchange.replayable:
            self.head = b""  # never sent again: not kept while the upstream thinks
        return exchange

    def _failed(self, exc: UpstreamFailure) -> Exception:
        """Done, unanswered: the exchange is closed, the failure becomes warmgate's error."""
        self._close()
        return translate(exc, self.runtime, "headers")

    def _close(self) -> None:
        self._sending = None
        exchange = self._exchange
        if exchange is not None:
            self._exchange = None
            exchange.close()


class _LimitedBody:
    """A request body of unknown length, cut off past ``limit`` bytes."""

    def __init__(self, content: aiohttp.StreamReader, limit: int, runtime: Runtime) -> None:
        self.content = content
        self.limit = limit
        self.runtime = runtime
        self.exceeded = False

    async def chunks(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self.content.iter_any():
            total += len(chunk)
            if total > self.limit:
                self.exceeded = True
                raise BodyTooLarge(
                    f"request body is larger than {self.limit} bytes", target=self.runtime.name
                )
            self.runtime.m_bytes_in.inc(len(chunk))
            yield chunk


def request_body(
    request: web.Request, runtime: Runtime, body: bytes | None = None
) -> tuple[RequestBody, bool, bytes]:
    """The body to send after the head, whether it goes chunk-framed, and how the head ends
    (the framing header, if any, and the blank line). ``body``: one already read instead."""
    if body is not None:
        runtime.m_bytes_in.inc(len(body))
        return body, False, b"Content-Length: %d\r\n\r\n" % len(body)
    if request.body_exists:
        length = request.content_length
        if length is not None:
            runtime.m_bytes_in.inc(length)
            return request.content.iter_any(), False, b"\r\n"
        limited = _LimitedBody(request.content, runtime.spec.limits.max_body, runtime)
        return limited.chunks(), True, _CHUNKED
    if request.content_length is None and needs_empty_length(request.method):
        return None, False, _EMPTY_LENGTH
    return None, False, b"\r\n"
