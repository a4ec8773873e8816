"""The waiting page's status poll and the release pacing (``waiting.release_rate``): a poll of a
target that is already ready takes no turn, so strangers' polls that go away (unauthenticated,
on the public listener) hold back no page that really waits. A real warmgate on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from aiohttp import web

from router.scale.state import Phase
from tests.helpers import one_target, serve_app, warmgate

PACED = {"release_rate": 0.001}
"""One turn in 1,000 s: a poll that took a turn would hold the next one back for that long."""


async def dropped_poll(port: int) -> None:
    """A client that asks for the status and goes away after a moment, answered or not."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /.warmgate/status/t?wait=5 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.2):
                await reader.read(1)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_dropped_polls_of_a_ready_target_keep_no_turn_from_a_real_page() -> None:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text="the engine")

    app = web.Application()
    app.router.add_get("/", page)
    async with serve_app(app) as engine:
        spec = {"routes": [{"path_prefix": "/"}], "backend": {"kind": "static", "url": engine}}
        async with warmgate(one_target("t", spec, waiting=PACED)) as wg:
            runtime = wg.runtime()
            assert runtime.state.phase is Phase.READY  # static: always on
            port = wg.server.public_port
            for _ in range(4):
                await asyncio.gather(*[dropped_poll(port) for _ in range(50)])
            assert runtime.turns.waiting == 0
            url = wg.url + "/.warmgate/status/t"
            # A guard, not a measure: a turn kept by each dropped poll is 1,000 s long.
            async with (
                aiohttp.ClientSession() as http,
                asyncio.timeout(60),
                http.get(url, params={"wait": "1"}) as resp,
            ):
                assert resp.status == 200
                assert (await resp.json())["ready"]
            assert runtime.turns.waiting == 0
