"""A bad websocket handshake opens nothing upstream: a client's upgrade with a broken
``Sec-WebSocket-Key`` or an unknown ``Sec-WebSocket-Version`` gets 400 before the engine's
websocket is connected, so twenty of them against ``limits.max_connections: 4`` leave the
target's connections free (before, each left an engine websocket open, and every later request
to the target waited for a connection until 504). Plain and held websockets alike."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web

from tests.helpers import serve_app, static_config, warmgate

OPENED = web.AppKey("opened", list)
"""One entry per websocket the engine accepted."""

BAD_HANDSHAKES = [
    {"Sec-WebSocket-Key": "short", "Sec-WebSocket-Version": "13"},
    {"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "99"},
]


def engine() -> web.Application:
    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        request.app[OPENED].append(request.path)
        async for msg in sock:
            if msg.type is WSMsgType.TEXT:
                await sock.send_str(msg.data)
        return sock

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app[OPENED] = []
    app.router.add_get("/ws", ws)
    app.router.add_get("/hello", hello)
    return app


@pytest.mark.parametrize("holds", [False, True], ids=["plain", "held"])
async def test_bad_handshakes_open_nothing_upstream_and_do_not_lock_the_target_out(
    holds: bool,
) -> None:
    app = engine()
    async with serve_app(app) as url:
        config: dict[str, Any] = static_config(
            url,
            limits={"max_connections": 4},
            timeouts={"response_headers": "3s"},
            waiting={"hold_websockets": holds},
        )
        async with warmgate(config) as wg, aiohttp.ClientSession() as client:
            for i in range(20):
                headers = {"Upgrade": "websocket", "Connection": "Upgrade"}
                headers.update(BAD_HANDSHAKES[i % 2])
                async with client.get(wg.url + "/ws", headers=headers) as resp:
                    assert resp.status == 400, await resp.text()
            async with client.get(wg.url + "/hello") as resp:
                assert resp.status == 200, "the bad handshakes locked the target out"
            assert app[OPENED] == [], "a bad handshake opened the engine's websocket"
            async with client.ws_connect(wg.url + "/ws") as ws:
                await ws.send_str("still served")
                assert await ws.receive_str(timeout=10) == "still served"
            assert app[OPENED] == ["/ws"]
