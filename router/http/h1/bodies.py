"""Bodies on the wire, both ways: a streamed request body sent to the upstream, and a response
body written from the upstream's socket callback straight into the client's transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable
from typing import Final, Protocol

from router.http.h1.errors import ConnectionBroken
from router.http.h1.interfaces import Carrier

DEFAULT_HIGH_WATER: Final = 64 * 1024
"""A client transport's high-water mark when it does not say (asyncio's default)."""


class Sending(Protocol):
    """What sending a request body needs of its exchange."""

    @property
    def error(self) -> BaseException | None:
        """The exchange failed already: stop sending."""
        ...

    def body_sent(self) -> None:
        """The whole body went out."""
        ...

    def body_failed(self, exc: BaseException) -> None:
        """Sending failed (the body too large, the client gone): the exchange is over."""
        ...


async def send_body(
    exchange: Sending, conn: Carrier, chunks: AsyncIterable[bytes], chunked: bool
) -> None:
    """Send a request body as it comes (chunk-framed when ``chunked``), waiting for the
    upstream to take each chunk."""
    transport = conn.transport
    try:
        async for chunk in chunks:
            if conn.lost or exchange.error is not None:
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
        exchange.body_sent()
    except ConnectionBroken:
        pass  # the response side reports what the upstream did
    except Exception as exc:
        exchange.body_failed(exc)


class Sink:
    """Where a piped response body goes: the client's transport, chunk-framed or not.

    Body bytes are views of the connection's read buffer: written as they are when the
    transport sends them at once, copied when it would queue them. Above the transport's
    high-water mark the upstream is not read (``paused``) until the client has caught up."""

    __slots__ = ("chunked", "high", "paused", "sent", "transport")

    def __init__(self, transport: asyncio.Transport, chunked: bool) -> None:
        self.transport = transport
        self.chunked = chunked
        try:
            high = transport.get_write_buffer_limits()[1]
        except (AttributeError, NotImplementedError):
            high = DEFAULT_HIGH_WATER
        self.high = high
        """Above this many bytes queued in the transport, the upstream is not read."""
        self.paused = False
        self.sent = 0

    def write(self, data: bytes | memoryview, conn: Carrier | None) -> bool:
        """Write ``data``; False (nothing written) when the client is gone."""
        transport = self.transport
        if transport.is_closing():
            return False
        view = type(data) is memoryview
        if view and transport.get_write_buffer_size():
            data = bytes(data)  # it would be queued: queue a copy, not the read buffer
            view = False
        if self.chunked:
            transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            transport.write(data)
        self.sent += len(data)
        pending = transport.get_write_buffer_size()
        if pending and conn is not None:
            if view:
                # The transport keeps a view of the read buffer until it sent the rest (one
                # buffer per slow client at most, see above): read into a fresh one.
                conn.renew_read_buffer()
            if pending > self.high:
                conn.pause_reading()
                self.paused = True
        return True
