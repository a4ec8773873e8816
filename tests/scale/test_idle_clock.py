"""The idle clock as /targets shows it: no ``idle_seconds`` while a target is starting (nothing
to be idle yet), and the end of an event stream is not activity: a stream counted by its frames
was last active at its last frame, however long it stayed open and silent afterwards."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from tests.helpers import ROOT, serve_app, static_config, warmgate

SILENCE = 2.0
"""Seconds an event stream stays open after its one event."""


def events_app() -> web.Application:
    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: the only event\n\n")
        await asyncio.sleep(SILENCE)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/events", events)
    return app


async def targets(admin: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(admin + "/targets") as resp:
        body: dict[str, Any] = await resp.json()
        return body


async def test_the_end_of_a_silent_stream_does_not_reset_the_idle_clock() -> None:
    async with serve_app(events_app()) as url:
        config = static_config(url, scaling={"stream_activity_window": "200ms"})
        async with warmgate(config) as wg, aiohttp.ClientSession() as http:
            async with http.get(wg.url + "/events") as resp:
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                body = await resp.read()
            assert b"the only event" in body
            idle = (await targets(wg.admin))["t"]["idle_seconds"]
    # Idle since the event's window ran out, ~SILENCE - 0.2 s before the stream ended; the end
    # of the stream itself counts for nothing.
    assert idle is not None and idle >= SILENCE / 2, idle


async def test_no_idle_seconds_while_a_target_is_starting() -> None:
    sleepy = {
        "routes": [{"path_prefix": "/"}],
        "backend": {
            "kind": "process",
            "command": ["python", "-m", "tests.sleepy_engine", "--port", "{port}", "--load", "30"],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"path": "/readyz", "interval": "50ms"},
    }
    config = static_config("http://127.0.0.1:9")
    config["targets"] = {"sleepy": sleepy}
    async with warmgate(config) as wg, aiohttp.ClientSession() as http:
        cold = (await targets(wg.admin))["sleepy"]
        assert cold["phase"] == "cold" and cold["idle_seconds"] is None
        held = asyncio.ensure_future(http.get(wg.url + "/", timeout=aiohttp.ClientTimeout(60)))
        runtime = wg.runtime("sleepy")
        await runtime.cell.wait_for(lambda s: s.phase.value == "starting")
        await asyncio.sleep(0.3)
        starting = (await targets(wg.admin))["sleepy"]
        assert starting["phase"] == "starting" and starting["held"] == 1
        assert starting["idle_seconds"] is None, starting
        held.cancel()
