"""A start's burst is let through at ``waiting.release_rate`` (2 a second for ``engine: gradio``),
and a Gradio app counts as ready only once its launch check (``HEAD /``, 3 s) is over: a burst of
page loads at "ready" made Wan2GP's launch check time out, and it exited."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from backends.engines.gradio import LAUNCH_CHECK, GradioEngine
from backends.specs import EngineSpec
from router.config import parse_config
from router.errors import HoldTimeout
from router.metrics import Metrics
from router.scale.hold import HoldResult, release_at
from router.scale.lifecycle import Lifecycle
from router.scale.targets import TargetRuntime
from tests.fakes import FakeBackend, FakeEngine
from tests.rig import GET


def test_release_at_paces_a_burst_and_starts_afresh_after_a_gap() -> None:
    assert release_at(float("-inf"), 10.0, None) == (10.0, float("-inf"))
    free, ats = float("-inf"), []
    for _ in range(3):
        at, free = release_at(free, 10.0, 2.0)
        ats.append(at)
    assert ats == [10.0, 10.5, 11.0]
    assert release_at(free, 60.0, 2.0) == (60.0, 60.5)


def target(engine: str, **waiting: Any) -> Any:
    spec = {"engine": engine, "routes": [{}], "backend": {"kind": "process", "command": ["e"]}}
    return parse_config({"targets": {"t": {**spec, "waiting": waiting}}}).targets["t"]


def test_release_rate_defaults_to_two_a_second_for_gradio_only() -> None:
    assert target("gradio").release_rate == 2.0
    assert target("gradio", release_rate=0).release_rate is None
    assert target("http").release_rate is None
    assert target("comfyui", release_rate=5).release_rate == 5.0


@pytest.mark.looptime
async def test_eight_requests_held_through_a_start_go_on_two_a_second() -> None:
    config = parse_config(
        {
            "targets": {
                "t": {
                    "routes": [{}],
                    "backend": {"kind": "process", "command": ["engine"]},
                    "scaling": {"idle_after": "30m", "cold_start_timeout": "5m"},
                    "waiting": {"release_rate": 2},
                }
            }
        }
    )
    loop = asyncio.get_running_loop()
    engine = FakeEngine()
    runtime = TargetRuntime("t", config.targets["t"], FakeBackend(), engine, Metrics(), loop)
    lifecycle = Lifecycle(runtime)
    engine.ready_at = loop.time() + 30
    await lifecycle.open()
    try:

        async def held() -> float:
            await runtime.acquire(GET)
            return loop.time()

        released = sorted(await asyncio.gather(*[held() for _ in range(8)]))
        first = released[0]
        assert first >= engine.ready_at
        assert [round(t - first, 3) for t in released] == [i / 2 for i in range(8)]
        # Ready and no burst under way: the next request is not held back.
        await asyncio.sleep(60)
        before = loop.time()
        await runtime.acquire(GET)
        assert loop.time() == before
    finally:
        await lifecycle.close()


@pytest.mark.looptime
async def test_a_gradio_app_is_ready_only_after_its_launch_check() -> None:
    asked: list[float] = []
    loop = asyncio.get_running_loop()

    async def config(request: web.Request) -> web.Response:
        asked.append(loop.time())
        return web.json_response({"api_prefix": "/gradio_api"})

    app = web.Application()
    app.router.add_get("/config", config)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    engine = GradioEngine(EngineSpec(kind="gradio"))
    base = f"http://127.0.0.1:{port}"
    try:
        assert not await engine.probe_ready(base)  # the app answered: its launch check runs
        await asyncio.sleep(LAUNCH_CHECK - 0.5)
        assert not await engine.probe_ready(base)
        assert len(asked) == 1  # nothing more is asked of it while the check may run
        await asyncio.sleep(0.5)
        assert await engine.probe_ready(base)
        assert not await engine.probe_ready(base)  # the next start waits again
    finally:
        await engine.close()
        await runner.cleanup()


def paced(rate: float, cold_start_timeout: str = "5m") -> Any:
    config = parse_config(
        {
            "targets": {
                "t": {
                    "routes": [{}],
                    "backend": {"kind": "process", "command": ["engine"]},
                    "scaling": {"idle_after": "30m", "cold_start_timeout": cold_start_timeout},
                    "waiting": {"release_rate": rate},
                }
            }
        }
    )
    return config.targets["t"]


@pytest.mark.looptime
async def test_held_requests_that_go_away_give_their_turns_back() -> None:
    loop = asyncio.get_running_loop()
    engine = FakeEngine()
    runtime = TargetRuntime("t", paced(2), FakeBackend(), engine, Metrics(), loop)
    lifecycle = Lifecycle(runtime)
    engine.ready_at = loop.time() + 30
    await lifecycle.open()
    try:

        async def held() -> float:
            await runtime.acquire(GET)
            return loop.time()

        first, *gone = [asyncio.ensure_future(held()) for _ in range(8)]
        await asyncio.sleep(1)
        last = asyncio.ensure_future(held())
        ready = await first
        assert ready >= engine.ready_at
        # Seven clients went away while in line for their turns (aiohttp cancels the handler).
        assert runtime.turns.waiting == 8
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
        assert runtime.turns.waiting == 1
        # The one left goes on one turn after the first, not behind seven that are gone.
        assert await last == ready + 0.5
        assert runtime.turns.waiting == 0
    finally:
        await lifecycle.close()


@pytest.mark.looptime
async def test_the_wait_for_a_turn_ends_at_the_holds_deadline() -> None:
    loop = asyncio.get_running_loop()
    engine = FakeEngine()
    metrics = Metrics()
    runtime = TargetRuntime("t", paced(0.01, "60s"), FakeBackend(), engine, metrics, loop)
    lifecycle = Lifecycle(runtime)
    begun = loop.time()
    engine.ready_at = begun + 30
    await lifecycle.open()
    try:
        results = await asyncio.gather(
            *[runtime.acquire(GET) for _ in range(2)], return_exceptions=True
        )
        went = [r for r in results if isinstance(r, HoldResult)]
        ran_out = [r for r in results if isinstance(r, HoldTimeout)]
        assert len(went) == 1 and len(ran_out) == 1, results
        # Its next turn was 100 s after the first: answered at the hold's own deadline, 504.
        assert loop.time() == begun + 60
        assert ran_out[0].status == 504
        assert runtime.turns.waiting == 0
        outcome = metrics.registry.get_sample_value(
            "warmgate_hold_outcomes_total", {"target": "t", "outcome": "timeout"}
        )
        assert outcome == 1.0
    finally:
        await lifecycle.close()
