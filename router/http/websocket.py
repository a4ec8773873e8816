"""Proxying one websocket: frames byte-exact both ways, close codes and reasons propagated,
pings answered on each side, no idle timeout (a render UI tab may say nothing for hours)."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from aiohttp import WSMsgType, web
from multidict import CIMultiDict
from yarl import URL

from router.errors import UpstreamError
from router.http.failures import translate
from router.http.proxy import COLD_START_HEADER
from router.http.runtime import Runtime

_GOING_AWAY = 1001
_CLOSE_TIMEOUT = 10.0
"""Seconds a close handshake may take before both sides are cut."""


def is_websocket_upgrade(request: web.BaseRequest) -> bool:
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return False
    connection = request.headers.get("Connection", "").lower()
    return "upgrade" in (token.strip() for token in connection.split(","))


async def _pump(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    runtime: Runtime,
    counts: bool,
    closing: asyncio.Event,
) -> None:
    activity = runtime.activity
    while True:
        msg = await source.receive()
        if msg.type is WSMsgType.TEXT:
            await sink.send_str(msg.data)
        elif msg.type is WSMsgType.BINARY:
            await sink.send_bytes(msg.data)
        elif msg.type is WSMsgType.CLOSE:
            code = msg.data if isinstance(msg.data, int) else 1000
            reason = (msg.extra or "").encode()[:123]
            closing.set()  # the other pump now only stops; it must not close anything itself
            await sink.close(code=code, message=reason)
            await source.close(code=code, message=reason)
            return
        else:  # CLOSING, CLOSED, ERROR
            if not closing.is_set() and not sink.closed:
                # The source went away without a close frame of its own.
                closing.set()
                await sink.close(code=_GOING_AWAY if msg.type is not WSMsgType.ERROR else 1011)
            return
        if counts:
            activity.last_frame = runtime.loop.time()


async def forward_websocket(
    request: web.Request,
    runtime: Runtime,
    session: aiohttp.ClientSession,
    url: URL,
    headers: CIMultiDict[str],
    cold_wait: float | None,
) -> web.StreamResponse:
    protocols = [
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
    ]
    try:
        async with asyncio.timeout(runtime.spec.timeouts.response_headers):
            upstream = await session.ws_connect(
                url,
                headers=headers,
                protocols=protocols,
                autoclose=False,
                autoping=True,
                heartbeat=None,
                max_msg_size=0,
                compress=0,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0),
            )
    except aiohttp.WSServerHandshakeError as exc:
        # The engine refused the upgrade (ComfyUI: 403 on an Origin mismatch): say the same.
        return web.Response(status=exc.status, text=exc.message or "websocket upgrade refused")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise translate(exc, runtime, "to the websocket upgrade") from exc

    downstream = web.WebSocketResponse(
        protocols=(upstream.protocol,) if upstream.protocol else (),
        autoclose=False,
        autoping=True,
        heartbeat=None,
        max_msg_size=0,
        compress=False,
    )
    if cold_wait is not None:
        downstream.headers[COLD_START_HEADER] = f"{cold_wait:.3f}"
    try:
        await downstream.prepare(request)
    except (ConnectionResetError, aiohttp.ClientError) as exc:
        await upstream.close()
        raise UpstreamError("client left during the upgrade", target=runtime.name) from exc

    key = object()
    closing = asyncio.Event()

    async def close(code: int, reason: str) -> None:
        closing.set()
        await downstream.close(code=code, message=reason.encode())
        await upstream.close(code=code, message=reason.encode())

    mode = runtime.engine.stream_activity(url.path)
    counts = mode == "frames"
    if mode == "open":  # activity for its whole life, like a request in flight
        runtime.activity.begin(runtime.loop.time())
    runtime.activity.streams[key] = close
    runtime.m_ws_open.inc()
    tasks = [
        asyncio.ensure_future(_pump(downstream, upstream, runtime, counts, closing)),
        asyncio.ensure_future(_pump(upstream, downstream, runtime, counts, closing)),
    ]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if closing.is_set() and pending:  # a close handshake is under way: let it finish
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
    finally:
        for task in tasks:
            task.cancel()
        runtime.activity.streams.pop(key, None)
        if mode == "open":
            runtime.activity.end(runtime.loop.time())
        runtime.m_ws_open.dec()
        if not upstream.closed:
            await upstream.close(code=_GOING_AWAY)
        if not downstream.closed:
            await downstream.close(code=_GOING_AWAY)
    return downstream
