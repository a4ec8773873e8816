"""``GET /status`` (the view as JSON) and ``GET /events`` (the same, live, as server-sent events).

One publisher builds the view for every watcher: at once when a target's state changes (the event
bus pokes it), else once a second while someone watches (activity, countdowns, GPU-seconds), and
sends it only when it differs from the last. The stream, for pages and scripts alike:

- ``event: events``: the last 200 events, newest first, once on connect;
- ``event: snapshot``: the view without the events (as ``GET /status``), on connect and on change;
- ``event: change``: one new event (a phase change, a start, a release, an action), as it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from aiohttp import web

from router.dashboard import view
from router.dashboard.view import Sources
from router.http.finite_json import dumps

PERIOD = 1.0
"""Seconds between two looks at the view while someone watches."""
IDLE_PERIOD = 10.0
"""Seconds between two readings of the counters while nobody watches (the day's rollover, the
hour's decisions)."""
KEEPALIVE = 15.0
"""An idle stream gets a comment this often (proxies close silent connections)."""


class Publisher:
    def __init__(self, src: Sources) -> None:
        self.src = src
        self.generation = 0
        self.body = "{}"
        """The view without its time of reading, as JSON."""
        self.watchers = 0
        self._seq = 0
        self._published = asyncio.Event()

    async def run(self, app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx`` of the admin app."""
        task = asyncio.get_running_loop().create_task(self._loop(), name="dashboard")
        yield
        self.src.bus.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _loop(self) -> None:
        bus = self.src.bus
        while not bus.closed:
            await bus.poked(PERIOD if self.watchers else IDLE_PERIOD)
            self.src.today.sample(self.src.loop_now())
            if self.watchers:
                self.publish()

    def publish(self) -> None:
        body = dumps(view.state(self.src), separators=(",", ":"))
        seq = self.src.bus.seq
        if body == self.body and seq == self._seq:
            return
        self.body, self._seq = body, seq
        self.generation += 1
        published, self._published = self._published, asyncio.Event()
        published.set()

    def snapshot(self) -> str:
        return f'{{"now":{time.time():.3f},{self.body[1:]}'

    async def wait(self, generation: int, timeout: float) -> None:  # noqa: ASYNC109
        """Until a view newer than ``generation`` is published, the bus closes, or ``timeout``."""
        if self.generation != generation or self.src.bus.closed:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._published.wait()

    def close(self) -> None:
        """The admin listener shuts down: every stream ends."""
        self.src.bus.close()
        published, self._published = self._published, asyncio.Event()
        published.set()


PUBLISHER = web.AppKey("dashboard_publisher", Publisher)


async def status(request: web.Request) -> web.Response:
    src = request.app[PUBLISHER].src
    return web.json_response(view.snapshot(src), headers={"Cache-Control": "no-store"}, dumps=dumps)


def _message(kind: str, data: str) -> bytes:
    return f"event: {kind}\ndata: {data}\n\n".encode()


async def events(request: web.Request) -> web.StreamResponse:
    publisher = request.app[PUBLISHER]
    bus = publisher.src.bus
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",  # a buffering reverse proxy would hold the stream back
        }
    )
    await response.prepare(request)
    publisher.watchers += 1
    try:
        publisher.publish()
        seq, generation = bus.seq, publisher.generation
        history = [event.to_json() for event in reversed(bus.events)]
        await response.write(_message("events", dumps(history)))
        await response.write(_message("snapshot", publisher.snapshot()))
        while not bus.closed:
            await publisher.wait(generation, KEEPALIVE)
            if bus.closed:
                break
            new = bus.newer_than(seq)
            for event in new:
                await response.write(_message("change", dumps(event.to_json())))
                seq = event.seq
            if publisher.generation != generation:
                generation = publisher.generation
                await response.write(_message("snapshot", publisher.snapshot()))
            elif not new:
                await response.write(b": keep-alive\n\n")
    except ConnectionResetError:  # the client went away
        pass
    finally:
        publisher.watchers -= 1
    return response
