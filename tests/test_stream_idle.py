"""The end of a stream is no activity: a target's idle clock runs from a stream's last frame
that counts (or its last job), not from when the stream closed. Real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from tests.helpers import serve_app, static_config, warmgate

RELEASE = web.AppKey("release", asyncio.Event)


def upstream() -> web.Application:
    async def sse(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        await request.app[RELEASE].wait()
        await response.write_eof()  # ends without another frame
        return response

    app = web.Application()
    app[RELEASE] = asyncio.Event()
    app.router.add_get("/events", sse)
    return app


async def test_a_stream_that_ends_does_not_reset_the_idle_clock() -> None:
    app = upstream()
    async with serve_app(app) as url:
        config = static_config(url, scaling={"stream_activity_window": "100ms"})
        async with warmgate(config) as wg, aiohttp.ClientSession() as http:
            activity = wg.runtime().activity
            loop = asyncio.get_running_loop()
            async with http.get(wg.url + "/events") as response:
                assert await response.content.readline() == b"data: one\n"
                last_frame = loop.time()
                assert activity.in_flight == 0  # a generic stream counts by its frames
                await asyncio.sleep(0.5)  # silent, longer than the window
                app[RELEASE].set()
                assert await response.read() == b"\n"
            ended = loop.time()
            assert activity.in_flight == 0
            idle_since = activity.idle_since(0.1)
            assert idle_since is not None
            assert idle_since <= last_frame + 0.1 < ended, "the stream's end counted as activity"
