"""The rules of a proxied websocket, written once for plain and held ones alike
(:mod:`router.http.bridge` applies them): the client's handshake checked before anything is
opened upstream, the engine's websocket connected, close codes and reasons (a close without a
code forwarded as one without), messages bounded by ``limits.max_ws_message`` (aiohttp checks
text frames are UTF-8), pings answered on each side, no idle timeout (a render UI tab may say
nothing for hours)."""

from __future__ import annotations

import asyncio
from typing import Any, Final

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from multidict import CIMultiDict
from yarl import URL

from router.errors import UpstreamError
from router.http.failures import translate
from router.http.lingering import ClientSocket
from router.http.runtime import Runtime

NO_CODE: Final = 0
"""aiohttp's close code for a close frame that carries none (what a browser's ``ws.close()``
sends). It is forwarded as a close without a code: a code 0 on the wire is a protocol error."""

NORMAL: Final = int(WSCloseCode.OK)
GOING_AWAY: Final = int(WSCloseCode.GOING_AWAY)
"""1001: a side went away without a close frame, a release, warmgate's shutdown."""


def close_for(why: str) -> tuple[int, str]:
    """The close code and reason of a stream warmgate ends, told why (scale's word, a
    ``router.scale.activity.StreamEnd``): every such end, a release or warmgate's shutdown,
    is a going away (1001), with the word as its reason."""
    return GOING_AWAY, why


MAX_REASON: Final = 123
"""Bytes of reason a close frame has room for (125 for a control frame, 2 for the code)."""

CLOSE_TIMEOUT: Final = 10.0
"""Seconds a close handshake may take before both sides are cut."""

SEND_ERRORS: Final = (ConnectionResetError, aiohttp.ClientError)
"""What sending on a socket whose connection is going raises."""

Socket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


def is_websocket_upgrade(request: web.BaseRequest) -> bool:
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return False
    connection = request.headers.get("Connection", "").lower()
    return "upgrade" in (token.strip() for token in connection.split(","))


def handshake_refusal(request: web.BaseRequest) -> web.Response | None:
    """The 400 for a client's upgrade aiohttp would not accept (a ``Sec-WebSocket-Key`` that is
    not 16 bytes in base64, an unknown ``Sec-WebSocket-Version``); ``None`` when it is good.
    Asked before anything is opened upstream (or a target woken) for it."""
    if web.WebSocketResponse().can_prepare(request).ok:
        return None
    return web.Response(
        status=400, text="bad websocket handshake: Sec-WebSocket-Key or Sec-WebSocket-Version"
    )


def client_socket(runtime: Runtime, protocol: str | None = None) -> ClientSocket:
    """The client's side of a proxied websocket, answering with the engine's ``protocol``; its
    connection ends in a lingering close (:mod:`router.http.lingering`)."""
    return ClientSocket(
        protocols=(protocol,) if protocol else (),
        autoclose=False,
        autoping=True,
        heartbeat=None,
        max_msg_size=runtime.spec.limits.max_ws_message + 1,  # aiohttp: below it
        compress=False,
    )


def close_reason(reason: str) -> bytes:
    """``reason`` in UTF-8, cut to :data:`MAX_REASON` bytes on a character boundary."""
    data = reason.encode()
    if len(data) <= MAX_REASON:
        return data
    return data[:MAX_REASON].decode("utf-8", "ignore").encode()


def ending(msg: aiohttp.WSMessage) -> tuple[int, str]:
    """The close code and reason the other side is told when one side's socket ends with
    ``msg``: a close frame's own (:data:`NO_CODE`: one without); a message aiohttp refused (and
    answered itself): 1009 for one over ``max_ws_message``, 1002 for a protocol error, else
    1011; a connection that ended without a close frame: 1001."""
    if msg.type is WSMsgType.CLOSE:
        return (msg.data if isinstance(msg.data, int) else NORMAL), msg.extra or ""
    if msg.type is WSMsgType.ERROR:
        code = getattr(msg.data, "code", WSCloseCode.INTERNAL_ERROR)
        if code == WSCloseCode.MESSAGE_TOO_BIG:
            return int(code), "message too big"
        if code == WSCloseCode.PROTOCOL_ERROR:
            return int(code), ""
        return int(WSCloseCode.INTERNAL_ERROR), ""
    return GOING_AWAY, ""


def lost(msg: aiohttp.WSMessage) -> bool:
    """Whether ``msg`` says the connection ended with neither a close frame nor a message
    aiohttp refused (the peer went away: a held websocket is held again)."""
    if msg.type is WSMsgType.CLOSE:
        return False
    return not (msg.type is WSMsgType.ERROR and hasattr(msg.data, "code"))


async def send(ws: Socket, kind: WSMsgType, data: str | bytes) -> None:
    """One message, text or binary, as it came."""
    if kind is WSMsgType.TEXT:
        assert isinstance(data, str)
        await ws.send_str(data)
    else:
        assert isinstance(data, bytes)
        await ws.send_bytes(data)


class UpstreamSocket(aiohttp.ClientWebSocketResponse):
    """aiohttp's client websocket that keeps its connection's transport, so that after a close
    without a code (which aiohttp's ``close()`` cannot send) the connection ends without a
    second close frame. The wiring gives it to each target's session (``ws_response_class``)."""

    def __init__(self, reader: Any, writer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(reader, writer, *args, **kwargs)
        self.transport: asyncio.BaseTransport | None = writer.transport


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
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_TIMEOUT),
            )
    except aiohttp.WSServerHandshakeError as exc:
        if exc.status < 200:  # a 101 whose handshake is wrong: no client gets a bare 101
            raise UpstreamError(
                f"target {runtime.name!r} answered the websocket upgrade with a bad handshake "
                f"({exc.message})",
                target=runtime.name,
            ) from exc
        # The engine refused the upgrade (ComfyUI: 403 on an Origin mismatch): say the same.
        return web.Response(status=exc.status, text=exc.message or "websocket upgrade refused")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise translate(exc, runtime, "to the websocket upgrade") from exc
