"""The tab's side of a held websocket (:mod:`router.routing.held_websockets`): its socket, one
reader of it for its whole life, what it said while nobody listened, and how it ended.

While the socket is bridged, what the tab sends goes to the engine's socket at once; while it is
held (the target not ready, or released), up to :data:`MAX_PENDING` messages are kept and go to
the engine first once bridged again (ComfyUI's frontend says ``feature_flags`` on connecting)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Final

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web

from router.http.websocket import NO_CODE, close_reason
from router.scale.activity import Activity

MAX_PENDING: Final = 64
"""Messages from the tab kept while its socket is held; the oldest are dropped beyond."""

GOING_AWAY: Final = 1001
_CLOSE_TIMEOUT: Final = 10.0
_SEND_ERRORS: Final = (ConnectionResetError, aiohttp.ClientError)

Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


class Tab:
    def __init__(
        self, activity: Activity, loop: asyncio.AbstractEventLoop, max_message: int, counts: bool
    ) -> None:
        """``counts``: the tab's frames are activity while bridged (a ``frames`` stream)."""
        self.socket = web.WebSocketResponse(
            autoclose=False,
            autoping=True,
            heartbeat=None,
            max_msg_size=max_message + 1,  # aiohttp: below it
            compress=False,
        )
        self.engine: aiohttp.ClientWebSocketResponse | None = None
        """Where the tab's messages go now; ``None`` while held (they are kept)."""
        self.pending: deque[tuple[WSMsgType, str | bytes]] = deque(maxlen=MAX_PENDING)
        self.gone = asyncio.Event()
        """The tab closed its socket, or left."""
        self.close_with: tuple[int, str] = (GOING_AWAY, "")
        """How the tab closed (forwarded to the engine's side): its code and reason."""
        self._activity = activity
        self._loop = loop
        self._counts = counts

    async def read(self) -> None:
        """Everything the tab sends, to its end: to the engine while bridged, kept while held."""
        try:
            while True:
                msg = await self.socket.receive()
                if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    await self._forward(msg.type, msg.data)
                    continue
                if msg.type is WSMsgType.CLOSE:
                    code = msg.data if isinstance(msg.data, int) and msg.data != NO_CODE else 1000
                    self.close_with = (code, msg.extra or "")
                elif msg.type is WSMsgType.ERROR:  # aiohttp refused a message (and answered)
                    code = getattr(msg.data, "code", WSCloseCode.INTERNAL_ERROR)
                    big = code == WSCloseCode.MESSAGE_TOO_BIG
                    self.close_with = (code, "message too big") if big else (GOING_AWAY, "")
                return
        finally:
            self.gone.set()

    async def _forward(self, kind: WSMsgType, data: str | bytes) -> None:
        engine = self.engine
        if engine is not None:
            try:
                await send(engine, kind, data)
            except _SEND_ERRORS:
                pass  # the engine's side is going: kept for the next one
            else:
                if self._counts:
                    self._activity.last_frame = self._loop.time()
                return
        self.pending.append((kind, data))

    async def bridge(self, engine: aiohttp.ClientWebSocketResponse) -> None:
        """From now on the tab's messages go to ``engine``; what it said while held first."""
        while self.pending:
            kind, data = self.pending.popleft()
            await send(engine, kind, data)
        self.engine = engine

    async def tell(self, kind: WSMsgType, data: str | bytes) -> bool:
        """Send the engine's message to the tab; False once the tab is gone."""
        try:
            await send(self.socket, kind, data)
        except _SEND_ERRORS:
            return False
        return True

    async def close(self, code: int, reason: str) -> None:
        if not self.socket.closed:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    await self.socket.close(code=code, message=close_reason(reason))


async def send(ws: Socket, kind: WSMsgType, data: str | bytes) -> None:
    """One message, text or binary, as it came."""
    if kind is WSMsgType.TEXT:
        assert isinstance(data, str)
        await ws.send_str(data)
    else:
        assert isinstance(data, bytes)
        await ws.send_bytes(data)
