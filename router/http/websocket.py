"""Proxying one websocket: frames byte-exact both ways, close codes and reasons propagated (a
close without a code as one without), messages bounded by ``limits.max_ws_message``, pings
answered on each side, no idle timeout (a render UI tab may say nothing for hours).

A websocket counts in flight from its upgrade request until the upstream answered it; then as
its engine says (``open``: in flight for its whole life; ``frames``: while it carries frames).
However it ends, it is accounted once (``ended``): one access-log line, one request counted."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Final

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from multidict import CIMultiDict
from yarl import URL

from router.errors import UpstreamError
from router.http.failures import translate
from router.http.proxy import COLD_START_HEADER
from router.http.runtime import Runtime

NO_CODE: Final = 0
"""aiohttp's close code for a close frame that carries none (what a browser's ``ws.close()``
sends). It is forwarded as a close without a code: a code 0 on the wire is a protocol error."""

MAX_REASON: Final = 123
"""Bytes of reason a close frame has room for (125 for a control frame, 2 for the code)."""

_GOING_AWAY: Final = 1001
_CLOSE_TIMEOUT: Final = 10.0
"""Seconds a close handshake may take before both sides are cut."""

Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse
Ended = Callable[[web.StreamResponse], object]
"""Told the response once a websocket is over (or its upgrade refused): it accounts it."""


def is_websocket_upgrade(request: web.BaseRequest) -> bool:
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return False
    connection = request.headers.get("Connection", "").lower()
    return "upgrade" in (token.strip() for token in connection.split(","))


def close_reason(reason: str) -> bytes:
    """``reason`` in UTF-8, cut to :data:`MAX_REASON` bytes on a character boundary."""
    data = reason.encode()
    if len(data) <= MAX_REASON:
        return data
    return data[:MAX_REASON].decode("utf-8", "ignore").encode()


class UpstreamSocket(aiohttp.ClientWebSocketResponse):
    """aiohttp's client websocket that keeps its connection's transport, so that after a close
    without a code (which aiohttp's ``close()`` cannot send) the connection ends without a
    second close frame. The wiring gives it to each target's session (``ws_response_class``)."""

    def __init__(self, reader: Any, writer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(reader, writer, *args, **kwargs)
        self.transport: asyncio.BaseTransport | None = writer.transport


class _Link:
    """One proxied websocket: the two sockets and the pumps between them."""

    def __init__(
        self,
        request: web.Request,
        runtime: Runtime,
        downstream: web.WebSocketResponse,
        upstream: aiohttp.ClientWebSocketResponse,
        counts: bool,
    ) -> None:
        self.request = request
        self.runtime = runtime
        self.downstream = downstream
        self.upstream = upstream
        self.counts = counts
        self.closing = asyncio.Event()
        """Set once a close is under way: the other pump then only stops."""
        self.sent_without_code: list[Socket] = []
        """Sides sent a close without a code: their connections end without another frame."""

    async def close(self, code: int, reason: str) -> None:
        """Close both sides (the release of the target, with the reason it gives)."""
        self.closing.set()
        message = close_reason(reason)
        await self.downstream.close(code=code, message=message)
        await self.upstream.close(code=code, message=message)

    def drop(self, ws: Socket) -> None:
        """End ``ws``'s connection without another frame (a later ``close()`` writes none)."""
        transport = (
            self.request.transport if ws is self.downstream else getattr(ws, "transport", None)
        )
        if transport is not None:
            transport.close()

    async def pump(self, source: Socket, sink: Socket) -> None:
        activity = self.runtime.activity
        loop = self.runtime.loop
        while True:
            msg = await source.receive()
            if msg.type is WSMsgType.TEXT:
                await sink.send_str(msg.data)
            elif msg.type is WSMsgType.BINARY:
                await sink.send_bytes(msg.data)
            elif msg.type is WSMsgType.CLOSE:
                if self.closing.is_set():
                    return  # the answer to a close this link forwarded: nothing more to say
                self.closing.set()
                await self._forward_close(source, sink, msg.data, msg.extra or "")
                return
            else:  # CLOSING, CLOSED, ERROR
                if not self.closing.is_set() and not sink.closed:
                    # The source went away without a close frame of its own, or sent what
                    # aiohttp refused (and answered itself): a message over max_ws_message, 1009.
                    self.closing.set()
                    code, reason = _GOING_AWAY, ""
                    if msg.type is WSMsgType.ERROR:
                        code = getattr(msg.data, "code", WSCloseCode.INTERNAL_ERROR)
                        if code == WSCloseCode.MESSAGE_TOO_BIG:
                            reason = "message too big"
                        elif code != WSCloseCode.PROTOCOL_ERROR:
                            code = WSCloseCode.INTERNAL_ERROR
                    await sink.close(code=code, message=reason.encode())
                return
            if self.counts:
                activity.last_frame = loop.time()

    async def _forward_close(self, source: Socket, sink: Socket, code: Any, reason: str) -> None:
        if code == NO_CODE:
            # Without a code both ways; the sink's answer is read (and dropped) by the other
            # pump, and the source, which has closed, has its answer at once.
            self.sent_without_code += (sink, source)
            await sink.send_frame(b"", WSMsgType.CLOSE)
            await source.send_frame(b"", WSMsgType.CLOSE)
            self.drop(source)
            return
        code = code if isinstance(code, int) else 1000
        message = close_reason(reason)
        await sink.close(code=code, message=message)
        await source.close(code=code, message=message)


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
    mode = runtime.engine.stream_activity(url.path)
    # From the upgrade on, the GPU must stay up for it: in flight while its upstream connects;
    # activity only where the engine counts its sockets open (a tab reconnecting is no use).
    counts = mode == "open"
    with runtime.in_flight(counts=counts) as in_flight:
        upstream = await connect_upstream(request, runtime, session, url, headers)
        if isinstance(upstream, web.Response):  # the engine refused the upgrade
            ended(upstream)
            return upstream
        if not counts:  # counted by its frames (or not at all) once it is up
            in_flight.end()
        by_frames = mode in ("frames", "jobs")  # a websocket is not watched for jobs
        return await _run(request, runtime, upstream, cold_wait, by_frames, ended)


async def connect_upstream(
    request: web.Request,
    runtime: Runtime,
    session: aiohttp.ClientSession,
    url: URL,
    headers: CIMultiDict[str],
) -> aiohttp.ClientWebSocketResponse | web.Response:
    """The engine's websocket at ``url`` with the client's subprotocols and ``headers``; the
    engine's refusal of the upgrade as the response to send instead. Raises
    :class:`router.errors.RequestError` when the engine cannot be reached."""
    protocols = [
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
    ]
    try:
        async with asyncio.timeout(runtime.spec.timeouts.response_headers):
            return await session.ws_connect(
                url,
                headers=headers,
                protocols=protocols,
                autoclose=False,
                autoping=True,
                heartbeat=None,
                max_msg_size=runtime.spec.limits.max_ws_message + 1,  # aiohttp: below it
                compress=0,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=_CLOSE_TIMEOUT),
            )
    except aiohttp.WSServerHandshakeError as exc:
        # The engine refused the upgrade (ComfyUI: 403 on an Origin mismatch): say the same.
        return web.Response(status=exc.status, text=exc.message or "websocket upgrade refused")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise translate(exc, runtime, "to the websocket upgrade") from exc


async def _run(
    request: web.Request,
    runtime: Runtime,
    upstream: aiohttp.ClientWebSocketResponse,
    cold_wait: float | None,
    counts: bool,
    ended: Ended,
) -> web.StreamResponse:
    downstream = web.WebSocketResponse(
        protocols=(upstream.protocol,) if upstream.protocol else (),
        autoclose=False,
        autoping=True,
        heartbeat=None,
        max_msg_size=runtime.spec.limits.max_ws_message + 1,  # aiohttp: below it
        compress=False,
    )
    if cold_wait is not None:
        downstream.headers[COLD_START_HEADER] = f"{cold_wait:.3f}"
    try:
        await downstream.prepare(request)
    except (ConnectionResetError, aiohttp.ClientError) as exc:
        await upstream.close()
        raise UpstreamError("client left during the upgrade", target=runtime.name) from exc

    link = _Link(request, runtime, downstream, upstream, counts)
    key = object()
    runtime.activity.streams[key] = link.close
    runtime.m_ws_open.inc()
    tasks = [
        asyncio.ensure_future(link.pump(downstream, upstream)),
        asyncio.ensure_future(link.pump(upstream, downstream)),
    ]
    try:
        await _until_closed(link, tasks)
    finally:
        for task in tasks:
            task.cancel()
        runtime.activity.streams.pop(key, None)
        runtime.m_ws_open.dec()
        ended(downstream)  # before any await: a cancelled handler may not get past the next
        for ws in link.sent_without_code:
            link.drop(ws)
        try:
            if not upstream.closed:
                await upstream.close(code=_GOING_AWAY)
        finally:
            if not downstream.closed:
                await downstream.close(code=_GOING_AWAY)
    return downstream


async def _until_closed(link: _Link, tasks: list[asyncio.Task[None]]) -> None:
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        # The client went away (aiohttp cancels its handler): its pump sees that at once and
        # tells the upstream how (a close, a message over the limit); it may, briefly.
        await asyncio.wait(tasks, timeout=_CLOSE_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        raise
    if link.closing.is_set() and pending:  # a close handshake is under way: let it finish
        finished, pending = await asyncio.wait(pending, timeout=_CLOSE_TIMEOUT)
        done |= finished
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    for task in done:
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
            task.result()
