"""The end of a client's websocket connection, closed so that warmgate's close frame reaches it.

Closing a socket whose kernel buffer still holds unread input (the rest of a message over
``limits.max_ws_message`` still arriving, say) makes Linux answer with a reset instead of a FIN,
and a reset can overtake the close frame written just before it: the client's next send fails
and a browser reports 1006 instead of the 1009 it was sent. So warmgate closes a client's
connection as a careful server does (a lingering close): once the close frame is written, its
write side is shut (the FIN follows the frame), and what the client still sends is read and
dropped until the client closes its side or :data:`LINGER` passes; only then is it closed."""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

LINGER: Final = 2.0
"""Seconds a client's input is drained after warmgate's close frame before its connection is cut:
enough for a client on a slow link to read the frame and stop sending; a client that goes on
sending past it is cut anyway (a reset then, the frame long delivered)."""


class Lingering(asyncio.Protocol):
    """Stands in for aiohttp's protocol on a connection being closed: the client's input is
    dropped, and the connection's end is told to aiohttp's protocol as before."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.inner = transport.get_protocol()
        loop = asyncio.get_running_loop()
        self.over: asyncio.Future[None] = loop.create_future()
        """The client closed its side (or the connection ended, or :data:`LINGER` passed)."""
        # Cut at the deadline even where no one waits: a close may wait on a client not reading.
        self.deadline = loop.call_later(LINGER, self._cut)
        transport.set_protocol(self)
        transport.resume_reading()  # aiohttp pauses it while its queue is full
        if transport.can_write_eof():
            transport.write_eof()  # after what is buffered: the close frame goes first

    def data_received(self, data: bytes) -> None:
        pass  # after the close frame nothing the client says is read

    def eof_received(self) -> bool:
        self._end()
        return True  # half-closed both ways: :meth:`ended` closes it

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        self.deadline.cancel()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _cut(self) -> None:
        self._end()
        self.transport.abort()

    def _end(self) -> None:
        if not self.over.done():
            self.over.set_result(None)

    async def ended(self) -> None:
        """Wait until the client closed its side (at most :data:`LINGER`), then close."""
        try:
            await self.over
        finally:
            self.transport.close()


class ClientSocket(web.WebSocketResponse):
    """aiohttp's server websocket whose connection ends in a lingering close, however it ends."""

    _transport: asyncio.Transport | None = None
    _lingering: Lingering | None = None

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter:
        self._transport = request.transport
        return await super().prepare(request)

    def _close_transport(self) -> None:
        # Where aiohttp closes the connection, in every way a websocket of its ends.
        self.linger()

    def linger(self) -> None:
        """Shut the write side once what was written is flushed, and drain the client's input
        until it closes its side (at most :data:`LINGER`); :meth:`lingered` waits for it."""
        transport = self._transport
        if transport is None or self._lingering is not None:
            return
        if transport.is_closing():
            transport.close()
            return
        self._lingering = Lingering(transport)

    async def lingered(self) -> None:
        """Wait for the lingering close, if one began, to end."""
        if self._lingering is not None:
            await self._lingering.ended()
