"""A target's upstream connections under ``limits.max_connections`` (HTTP and websockets counted
together once, a request waiting for a free one counted as held and bounded by the connect
timeout), and when the response-headers timer starts: through warmgate, real servers on
127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from tests.helpers import metric_value, serve_app, static_config, wait_until, warmgate


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


class Upstream:
    """``/slow`` answers once released; ``/ws`` echoes; every connection is counted."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting = 0
        self.transports: set[asyncio.BaseTransport] = set()
        """The transport of every connection that carried a request."""

    @property
    def open(self) -> int:
        return sum(not transport.is_closing() for transport in self.transports)

    def app(self) -> web.Application:
        async def slow(request: web.Request) -> web.Response:
            self.waiting += 1
            await self.release.wait()
            self.waiting -= 1
            return web.Response(text=request.path)

        async def ws(request: web.Request) -> web.WebSocketResponse:
            sock = web.WebSocketResponse()
            await sock.prepare(request)
            async for msg in sock:
                await sock.send_str(msg.data)
            return sock

        async def on_connection(request: web.Request) -> None:
            assert request.transport is not None
            self.transports.add(request.transport)

        app = web.Application()
        app.on_response_prepare.append(lambda request, response: on_connection(request))
        app.router.add_get("/ws", ws)
        app.router.add_get("/{tail:.*}", slow)
        return app


async def held(wg: object) -> float:
    return await metric_value(wg.admin, "warmgate_held_requests", target="t")  # type: ignore[attr-defined]


async def test_a_request_waiting_for_a_free_connection_is_held_until_the_connect_timeout(
    client: aiohttp.ClientSession,
) -> None:
    upstream = Upstream()
    async with serve_app(upstream.app()) as url:
        config = static_config(url, limits={"max_connections": 1}, timeouts={"connect": "1s"})
        async with warmgate(config) as wg:
            first = asyncio.ensure_future(client.get(wg.url + "/first"))
            await wait_until(lambda: upstream.waiting == 1)
            second = asyncio.ensure_future(client.get(wg.url + "/second"))
            await wait_until(lambda: wg.runtime().activity.held == 1)
            assert await held(wg) == 1
            async with await second as resp:  # no free connection within the connect timeout
                assert resp.status == 504
                assert "in time" in (await resp.json())["error"]["message"]
            assert wg.runtime().activity.held == 0 and await held(wg) == 0
            errors = await metric_value(
                wg.admin, "warmgate_upstream_errors_total", kind="connect_timeout"
            )
            assert errors == 1
            upstream.release.set()
            async with await first as resp:
                assert resp.status == 200 and await resp.text() == "/first"
            async with client.get(wg.url + "/third") as resp:  # a free one in time
                assert resp.status == 200


async def test_websockets_and_requests_share_max_connections(
    client: aiohttp.ClientSession,
) -> None:
    upstream = Upstream()
    upstream.release.set()
    async with serve_app(upstream.app()) as url:
        config = static_config(url, limits={"max_connections": 2}, timeouts={"connect": "1s"})
        async with warmgate(config) as wg:
            async with client.get(wg.url + "/warm") as resp:  # one kept-alive HTTP connection
                assert resp.status == 200
            sockets = [await client.ws_connect(wg.url + "/ws") for _ in range(2)]
            for sock in sockets:
                await sock.send_str("hi")
                assert (await sock.receive()).data == "hi"
            await wait_until(lambda: upstream.open == 2)  # the idle one made room for the second
            async with client.get(wg.url + "/blocked") as resp:  # both are websockets'
                assert resp.status == 504
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(wg.url + "/ws")
            assert refused.value.status == 504
            await sockets[0].close()
            async with client.get(wg.url + "/after") as resp:  # a websocket closed: room
                assert resp.status == 200
            assert upstream.open == 2
            await sockets[1].close()
    assert len(upstream.transports) == 4  # /warm, two websockets, /after


async def test_the_response_headers_timer_starts_once_the_body_is_sent(
    client: aiohttp.ClientSession,
) -> None:
    async def read_then_answer(request: web.Request) -> web.Response:
        size = len(await request.read())
        return web.Response(text=str(size))

    app = web.Application()
    app.router.add_post("/up", read_then_answer)

    async def slow_body() -> AsyncIterator[bytes]:
        for _ in range(6):
            yield b"x" * 1000
            await asyncio.sleep(0.25)  # the upload takes longer than response_headers

    async with serve_app(app) as url:
        config = static_config(url, timeouts={"response_headers": "500ms"})
        async with warmgate(config) as wg:
            async with client.post(wg.url + "/up", data=slow_body()) as resp:
                assert resp.status == 200 and await resp.text() == "6000"
            length = {"Content-Length": "6000"}
            async with client.post(wg.url + "/up", data=slow_body(), headers=length) as resp:
                assert resp.status == 200 and await resp.text() == "6000"
