"""One client's websocket bridged to an engine's, plain or held: the one implementation of the
pipe, the close handshake and the accounting (:mod:`router.http.websocket` has the rules).

A plain websocket is bridged once, to the engine's socket its upgrade connected. A held one
(``waiting.hold_websockets``, :mod:`router.routing.held_websockets`) may start with no engine's
socket and outlive several: while there is none, what the client sends is kept (up to
:data:`MAX_PENDING` messages, sent first once bridged) and a release closes only the engine's
side. The client's socket has one reader for its whole life.

Counted in flight from the upgrade until the engine's socket is up; then as the engine says
(``open``: in flight while bridged; ``frames``: activity while it carries frames), each count in
a block of its own. However it ends, it is accounted once (``ended``): one access-log line, one
request counted."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Final

import aiohttp
from aiohttp import WSMsgType, web
from multidict import CIMultiDict
from yarl import URL

from router.errors import UpstreamError
from router.http.proxy import COLD_START_HEADER
from router.http.runtime import Flight, Runtime
from router.http.websocket import (
    CLOSE_TIMEOUT,
    GOING_AWAY,
    NO_CODE,
    SEND_ERRORS,
    Socket,
    client_socket,
    close_for,
    close_reason,
    connect_upstream,
    ending,
    lost,
    send,
)

MAX_PENDING: Final = 64
"""Messages from a held client kept while no engine's socket is there; the oldest dropped."""

Ended = Callable[[web.StreamResponse], object]
"""Told the response once a websocket is over (or its upgrade refused): it accounts it."""


class Ends(Enum):
    """How one bridge to an engine's socket ended."""

    RELEASED = "released"
    """warmgate closed the engine's side (a release): a held client's socket is held again."""
    LOST = "lost"
    """The engine's connection ended without a close frame (it went away): held again."""
    CLOSED = "closed"
    """A close went through: the engine's, or the release of a plain websocket."""
    GONE = "gone"
    """The client closed its socket, or left."""


Again = Callable[[Ends | None], Awaitable[aiohttp.ClientWebSocketResponse | None]]
"""Holding: the engine's next socket once the last bridge ended so (``None``: none yet), or
``None`` when the client's socket is to end."""


class Bridge:
    """One client's websocket, from its upgrade to its end."""

    def __init__(
        self,
        request: web.Request,
        runtime: Runtime,
        path: str,
        ended: Ended,
        protocol: str | None = None,
        holds: Callable[[], bool] | None = None,
    ) -> None:
        """``path``: the engine's (without its query), for how its streams count; ``holds``:
        for a held websocket, whether a release holds it again (not at warmgate's shutdown)."""
        self.request = request
        self.runtime = runtime
        self.ended = ended
        self.holds = holds
        mode = runtime.engine.stream_activity(path)
        self.open_mode = mode == "open"
        """In flight while bridged (else by its frames, or not at all)."""
        self.counts = mode in ("frames", "jobs")  # a websocket is not watched for jobs
        self.client = client_socket(runtime, protocol)
        self.upstream: aiohttp.ClientWebSocketResponse | None = None
        """The engine's socket now, from its connection to its close."""
        self.first_text: str | None = None
        """The first text message an engine sent this client (ComfyUI: its ``status``, which
        names the client)."""
        self.gone = asyncio.Event()
        """The client closed its socket, or left."""
        self.close_with: tuple[int, str] = (GOING_AWAY, "")
        """How the client ended (told the engine's side): a code and a reason."""
        self.closing = False
        """A close is under way: what either side says next only ends its part."""
        self._sink: aiohttp.ClientWebSocketResponse | None = None
        """Where the client's messages go; ``None`` while held (they are kept)."""
        self._pending: deque[tuple[WSMsgType, str | bytes]] = deque(maxlen=MAX_PENDING)
        self._released = False
        self._dropped: set[int] = set()
        self._reader: asyncio.Future[None] | None = None

    async def serve(
        self,
        upstream: aiohttp.ClientWebSocketResponse | None,
        flight: Flight | None = None,
        cold_wait: float | None = None,
        again: Again | None = None,
    ) -> web.StreamResponse:
        """Answer the upgrade and bridge the client to ``upstream`` (its ``flight``, the
        upgrade's, ends with that bridge); holding (``again``), to each next one until the
        client's socket ends. The engine's socket is closed however this ends. Raises
        :class:`router.errors.UpstreamError` when the client left during the upgrade."""
        self.upstream = upstream
        how: Ends | None = None
        try:
            with flight or contextlib.nullcontext():
                await self._accept(cold_wait)
                if self.upstream is not None:
                    how = await self._bridge(self.upstream)
            while again is not None and how not in (Ends.CLOSED, Ends.GONE):
                self.upstream = None  # closed by the release, or gone (or none yet)
                self.upstream = await again(how)
                if self.upstream is None:
                    break
                with self.runtime.in_flight() if self.open_mode else contextlib.nullcontext():
                    how = await self._bridge(self.upstream)
        finally:
            await self._finish()
        return self.client

    async def close_client(self, code: int, reason: str) -> None:
        """End the client's socket with ``code`` and ``reason`` (and the engine's with it)."""
        self.closing = True
        self.close_with = (code, reason)
        await self._close(self.client, code, reason)

    async def release(self, code: int, reason: str) -> None:
        """The target is released (or warmgate shuts down): both sides closed with ``code``,
        or, for a held websocket that is held again, only the engine's."""
        upstream = self.upstream
        if self.holds is not None and self.holds():
            if upstream is not None and not upstream.closed:
                self._released, self._sink = True, None
                try:
                    await self._close(upstream, code, reason)
                finally:
                    self._released = False
            return
        await self.close_client(code, reason)
        if upstream is not None:
            await self._close(upstream, code, reason)

    # -- the client's side ------------------------------------------------------------------

    async def _accept(self, cold_wait: float | None) -> None:
        if cold_wait is not None:
            self.client.headers[COLD_START_HEADER] = f"{cold_wait:.3f}"
        try:
            await self.client.prepare(self.request)
        except (ConnectionResetError, aiohttp.ClientError) as exc:
            name = self.runtime.name
            raise UpstreamError("client left during the upgrade", target=name) from exc
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        """Everything the client sends, to its end: to the engine while bridged, else kept."""
        activity, loop = self.runtime.activity, self.runtime.loop
        try:
            while True:
                msg = await self.client.receive()
                if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    if not self.closing:
                        self.close_with = ending(msg)
                    return
                sink = self._sink
                if sink is not None:
                    try:
                        await send(sink, msg.type, msg.data)
                    except SEND_ERRORS:
                        pass  # the engine's side is going: kept for the next one
                    else:
                        if self.counts:
                            activity.last_frame = loop.time()
                        continue
                self._pending.append((msg.type, msg.data))
        finally:
            self.gone.set()

    # -- bridged ------------------------------------------------------------------------------

    async def _bridge(self, upstream: aiohttp.ClientWebSocketResponse) -> Ends:
        with self.runtime.stream(self._ended_by_warmgate, websocket=True):
            return await self._bridged(upstream)

    async def _ended_by_warmgate(self, why: str) -> None:
        """A release, or warmgate's shutdown (scale says which): closed as :meth:`release`."""
        await self.release(*close_for(why))

    async def _bridged(self, upstream: aiohttp.ClientWebSocketResponse) -> Ends:
        pump: asyncio.Future[Ends] | None = None
        gone = asyncio.ensure_future(self.gone.wait())
        try:
            while self._pending:  # what the client said while held goes first
                kind, data = self._pending.popleft()
                await send(upstream, kind, data)
            self._sink = upstream
            pump = asyncio.ensure_future(self._pump(upstream))
            try:
                await asyncio.wait((pump, gone), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                # The client went away (aiohttp cancels its handler): its reader sees how at
                # once, and the engine's side is told so as this ends.
                await asyncio.wait((gone,), timeout=CLOSE_TIMEOUT)
                raise
            if self.closing and not pump.done():  # a close handshake is under way: let it end
                await asyncio.wait((pump,), timeout=CLOSE_TIMEOUT)
            return pump.result() if pump.done() else Ends.GONE
        finally:
            self._sink = None
            gone.cancel()
            if pump is not None and not pump.done():
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump

    async def _pump(self, upstream: aiohttp.ClientWebSocketResponse) -> Ends:
        """The engine's messages to the client until the engine's side ends; how it ended."""
        activity, loop = self.runtime.activity, self.runtime.loop
        while True:
            msg = await upstream.receive()
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                if msg.type is WSMsgType.TEXT and self.first_text is None:
                    self.first_text = msg.data
                try:
                    await send(self.client, msg.type, msg.data)
                except SEND_ERRORS:
                    await self.gone.wait()
                    return Ends.GONE
                if self.counts:
                    activity.last_frame = loop.time()
                continue
            if self._released:
                return Ends.RELEASED
            if self.closing:  # the answer to a close under way: nothing more to say
                return Ends.CLOSED
            if self.holds is not None and lost(msg):
                return Ends.LOST
            code, reason = ending(msg)
            await self.close_client(code, reason)
            if msg.type is WSMsgType.CLOSE:
                await self._close(upstream, code, reason)  # the engine's close answered
            return Ends.CLOSED

    # -- the end ------------------------------------------------------------------------------

    async def _finish(self) -> None:
        accepted = self._reader is not None
        if accepted:
            self.ended(self.client)  # before any await: a cancelled handler may not get further
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        code, reason = self.close_with
        try:
            if self.upstream is not None:
                await self._close(self.upstream, code, reason)
        finally:
            if accepted:
                await self._close(self.client, code, reason)
                # Before the handler ends: aiohttp would close the connection under the drain.
                await self.client.lingered()

    async def _close(self, ws: Socket, code: int, reason: str) -> None:
        """Close ``ws`` with ``code`` and ``reason``, at most :data:`CLOSE_TIMEOUT` long. A close
        without a code is one frame with no body, and the connection then ends: aiohttp's
        ``close()`` cannot send it, and the peer's answer is not waited for."""
        if ws.closed or id(ws) in self._dropped:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT):
                if code != NO_CODE:
                    await ws.close(code=code, message=close_reason(reason))
                    return
                self._dropped.add(id(ws))
                await ws.send_frame(b"", WSMsgType.CLOSE)
                if ws is self.client:
                    self.client.linger()
                elif (transport := getattr(ws, "transport", None)) is not None:
                    transport.close()


async def forward_websocket(
    request: web.Request,
    runtime: Runtime,
    session: aiohttp.ClientSession,
    url: URL,
    headers: CIMultiDict[str],
    cold_wait: float | None,
    ended: Ended,
) -> web.StreamResponse:
    """Connect ``url``, answer the upgrade, and pipe frames until either side closes.

    ``ended`` is told every response this returns, and an upgraded websocket however it ends
    (a client that goes away cancels this handler). Raises :class:`router.errors.RequestError`
    (accounted by the caller) when the upstream cannot be reached."""
    open_mode = runtime.engine.stream_activity(url.path) == "open"
    # From the upgrade on, the GPU must stay up for it: in flight while its upstream connects;
    # activity only where the engine counts its sockets open (a tab reconnecting is no use).
    with runtime.in_flight(counts=open_mode) as flight:
        upstream = await connect_upstream(request, runtime, session, url, headers)
        if isinstance(upstream, web.Response):  # the engine refused the upgrade
            ended(upstream)
            return upstream
        bridge = Bridge(request, runtime, url.path, ended, upstream.protocol)
        if open_mode:  # in flight until its bridge ends (serve's block ends this flight)
            return await bridge.serve(upstream, flight, cold_wait)
    # counted by its frames (or not at all) once it is up
    return await bridge.serve(upstream, None, cold_wait)
