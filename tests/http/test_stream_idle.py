"""The end of a stream is no activity: a target's idle clock runs from a stream's last frame
that counts (or its last job), not from when the stream closed. Real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import pytest
from aiohttp import web

from router.scale.release import Release
from router.scale.state import Phase
from tests.helpers import (
    ROOT,
    metric_value,
    one_target,
    serve_app,
    static_config,
    wait_until,
    warmgate,
)

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


async def test_a_stream_cut_by_warmgate_s_own_stop_counts_no_upstream_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream warmgate did not close before it stopped the engine (the leader of several
    replicas stops first and closes streams after; a Gradio tab's heartbeat) is cut by that
    stop: warmgate's doing, so no ``reset`` is counted against the engine."""

    async def not_yet(self: Release) -> None:
        return None

    monkeypatch.setattr(Release, "close_streams", not_yet)
    spec = {
        "routes": [{"path_prefix": "/"}],
        "backend": {
            "kind": "process",
            "command": [sys.executable, "-m", "tests.sleepy_engine", "--port", "{port}"],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"path": "/readyz", "interval": "50ms"},
        "scaling": {"idle_after": "1s", "stream_activity_window": "100ms"},
    }
    async with warmgate(one_target("t", spec)) as wg, aiohttp.ClientSession() as http:
        runtime = wg.runtime()
        async with http.get(wg.url + "/events") as response:
            assert await response.content.readline() == b"data: one\n"
            await response.read()  # quiet: idle, released, and ended cleanly at the stop
        await wait_until(lambda: runtime.state.phase is Phase.COLD, timeout=20)
        resets = await metric_value(wg.admin, "warmgate_upstream_errors_total", kind="reset")
        assert resets == 0, "warmgate's own stop counted as the engine's reset"
