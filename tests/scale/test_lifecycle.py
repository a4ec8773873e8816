"""The lifecycle with fake backend and engine twins and a fast-forwarded loop clock: half-hour
idle windows pass in milliseconds; every race is played out deterministically."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from backends.base import RequestFacts
from router.config import parse_config
from router.errors import HoldTimeout, Shedding, TargetAsleep, TargetFailed
from router.http.websocket import close_for
from router.metrics import Metrics
from router.scale.lifecycle import Lifecycle
from router.scale.machine import Event
from router.scale.scaling import Act, decide
from router.scale.state import Phase
from router.scale.targets import TargetRuntime
from router.simulate.clock import VirtualLoop
from tests.fakes import FakeBackend, FakeEngine
from tests.rig import Rig

pytestmark = pytest.mark.looptime

WEBSOCKET = RequestFacts(method="GET", path="/ws", is_websocket=True, is_navigation=False)


def make_rig(**scaling: Any) -> Rig:
    config = parse_config(
        {
            "targets": {
                "t": {
                    "routes": [{}],
                    "backend": {"kind": "process", "command": ["engine"]},
                    "scaling": {"idle_after": "30m", "cold_start_timeout": "5m", **scaling},
                }
            }
        }
    )
    backend, engine, metrics = FakeBackend(), FakeEngine(), Metrics()
    loop = asyncio.get_running_loop()
    runtime = TargetRuntime("t", config.targets["t"], backend, engine, metrics, loop)
    return Rig(runtime, backend, engine, Lifecycle(runtime), metrics, labels={"target": "t"})


@asynccontextmanager
async def running(**scaling: Any) -> AsyncIterator[Rig]:
    """Started inside the test, so its timers live on the test's fast-forwarded clock."""
    r = make_rig(**scaling)
    await r.lifecycle.open()
    try:
        yield r
    finally:
        await r.lifecycle.close()


async def test_a_held_request_starts_the_target_and_goes_out_when_ready() -> None:
    async with running() as rig:
        loop = asyncio.get_running_loop()
        rig.engine.ready_at = loop.time() + 95  # a heavy render image
        assert rig.phase is Phase.COLD
        waits = [rig.serve(0.1) for _ in range(50)]
        await rig.until(Phase.STARTING)
        assert rig.backend.calls == ["up"]
        held = await asyncio.gather(*waits)
        assert all(94.5 <= w <= 96 for w in held), held
        assert rig.phase is Phase.READY
        assert rig.backend.calls == ["up"], "one scale-up for fifty held requests"
        assert rig.metric("warmgate_cold_starts_total") == 1
        assert rig.metric("warmgate_hold_outcomes_total", outcome="ready") == 50
        assert rig.runtime.learned.predicted_cold_start() == pytest.approx(95, abs=1)


async def test_idle_release_after_idle_after_and_not_before() -> None:
    async with running() as rig:
        await rig.serve(1)
        ready_since = rig.runtime.loop.time()
        await rig.until(Phase.COLD)
        idle = rig.runtime.loop.time() - ready_since
        assert 30 * 60 <= idle < 30 * 60 + 2
        assert rig.backend.calls == ["up", "down"]
        assert rig.metric("warmgate_idle_releases_total") == 1
        assert rig.metric("warmgate_gpu_seconds_total", state="idle") >= 29 * 60


async def test_never_stopped_while_a_request_is_in_flight() -> None:
    async with running() as rig:
        long = rig.serve(3 * 3600)  # a three-hour render through one request
        await rig.until(Phase.READY)
        await asyncio.sleep(2 * 3600)
        assert rig.phase is Phase.READY and rig.backend.calls == ["up"]
        await long
        await rig.until(Phase.COLD)
        assert rig.metric("warmgate_gpu_seconds_total", state="busy") >= 3 * 3600 - 5


async def test_engine_busy_signal_keeps_the_target() -> None:
    async with running() as rig:
        await rig.serve(0)
        rig.engine.busy_now = True  # a render in the engine's own queue, no HTTP at all
        await asyncio.sleep(3 * 3600)
        assert rig.phase is Phase.READY
        rig.engine.busy_now = False
        await rig.until(Phase.COLD)


async def test_stream_frames_are_activity_silent_streams_are_not() -> None:
    async with running() as rig:
        await rig.serve(0)
        activity = rig.runtime.activity
        closed: list[int] = []

        async def close(why: str) -> None:
            code, _ = close_for(why)  # the close code http gives scale's word
            closed.append(code)

        activity.streams[object()] = close
        for _ in range(90):  # a frame a minute for ninety minutes
            activity.last_frame = rig.runtime.loop.time()
            await asyncio.sleep(60)
        assert rig.phase is Phase.READY
        await rig.until(Phase.COLD)  # then silence: released, the stream closed with 1001
        assert closed == [1001]


async def test_a_request_during_the_drain_cancels_it() -> None:
    async with running() as rig:
        await rig.serve(0)
        late: list[asyncio.Task[float]] = []
        closed: list[int] = []

        async def close(why: str) -> None:
            code, _ = close_for(why)  # the close code http gives scale's word
            closed.append(code)

        rig.runtime.activity.streams[object()] = close

        async def arrives_meanwhile() -> None:
            if rig.phase is Phase.DRAINING and not late:
                late.append(rig.serve(5))  # while the drain takes its last look
                await asyncio.sleep(0.5)

        rig.engine.during_busy_check = arrives_meanwhile
        await rig.until(Phase.DRAINING)
        await rig.until(Phase.READY)
        assert await late[0] == 0.0, "served at once by the process that was still up"
        assert rig.backend.calls == ["up"]
        assert closed == [], "a cancelled drain leaves open streams (Gradio heartbeats) alone"
        await rig.until(Phase.COLD)
        assert rig.backend.calls == ["up", "down"]
        assert closed == [1001]


async def test_a_request_after_the_stop_is_held_for_the_next_start() -> None:
    async with running() as rig:
        await rig.serve(0)
        rig.backend.stop_gate = asyncio.Event()
        await rig.runtime.cell.wait_for(lambda s: s.stopping)
        request = rig.serve(0)
        await asyncio.sleep(10)
        assert not request.done(), "must not be sent to a process that is stopping"
        rig.backend.stop_gate.set()
        waited = await request
        assert waited >= 10
        assert rig.backend.calls == ["up", "down", "up"]
        assert rig.phase is Phase.READY


async def test_hold_deadline_is_a_504_and_the_start_fails() -> None:
    async with running(cold_start_timeout="2m") as rig:
        rig.engine.ready_at = float("inf")
        with pytest.raises(HoldTimeout, match="did not become ready within 120s"):
            await rig.serve(0)
        await rig.until(Phase.FAILED)
        assert rig.runtime.state.reason == "not ready after 120s"


async def test_failed_start_answers_held_requests_then_backs_off() -> None:
    async with running(failure_backoff="10s", failure_backoff_max="40s") as rig:
        rig.backend.fail_start = "cannot start 'engine': No such file or directory"
        with pytest.raises(TargetFailed) as failed:
            await rig.serve(0)
        assert "engine" not in failed.value.message, "the reason stays in the log"
        loop = rig.runtime.loop
        for expected_backoff in (10, 20, 40, 40):
            state = rig.runtime.state
            assert state.phase is Phase.FAILED
            assert state.retry_at - state.since == pytest.approx(expected_backoff)
            with pytest.raises(TargetFailed):  # during the backoff: answered at once, not held
                await rig.serve(0)
            await asyncio.sleep(state.retry_at - loop.time() + 0.01)
            with pytest.raises(TargetFailed):
                await rig.serve(0)
        rig.backend.fail_start = None
        await asyncio.sleep(41)
        assert await rig.serve(0) >= 0
        assert rig.runtime.state.failures == 0


async def test_a_crash_while_ready_goes_cold_and_the_next_request_wakes_it() -> None:
    async with running() as rig:
        await rig.serve(0)
        rig.backend.crash()
        await rig.until(Phase.COLD)
        await rig.serve(0)
        assert rig.phase is Phase.READY
        assert rig.backend.calls == ["up", "down", "up"]


async def test_websocket_upgrades_do_not_wake_a_cold_target() -> None:
    async with running() as rig:
        with pytest.raises(TargetAsleep):
            await rig.runtime.acquire(WEBSOCKET)
        await asyncio.sleep(60)
        assert rig.phase is Phase.COLD and rig.backend.calls == []


async def test_over_max_held_is_shed() -> None:
    async with running(max_held=3) as rig:
        rig.engine.ready_at = rig.runtime.loop.time() + 30
        held = [rig.serve(0) for _ in range(3)]
        await asyncio.sleep(1)
        with pytest.raises(Shedding) as shed:
            await rig.serve(0)
        assert shed.value.retry_after is not None
        await asyncio.gather(*held)


async def test_a_held_client_that_leaves_is_not_activity() -> None:
    async with running() as rig:
        rig.engine.ready_at = rig.runtime.loop.time() + 60
        request = rig.serve(0)
        await asyncio.sleep(5)
        assert rig.runtime.activity.held == 1
        request.cancel()
        await asyncio.sleep(0)
        assert rig.runtime.activity.held == 0
        assert rig.metric("warmgate_hold_outcomes_total", outcome="disconnected") == 1
        await rig.until(Phase.READY)
        await rig.until(Phase.COLD)  # it starts (someone asked), then idles out normally


async def _drain_on_the_boundary() -> Rig:
    rig = make_rig(idle_after="2s")
    rt = rig.runtime
    await rig.backend.scale_up()
    rig.lifecycle.machine.apply(Event.START, "a request is waiting")
    rig.lifecycle.machine.apply(Event.READY, "ready", endpoints=(rig.backend.endpoint,))
    rt.activity.last_request = 22061.785  # 2.0 s before, in the loop's own readings
    step = decide(rig.lifecycle.view())
    assert step.act is Act.DRAIN
    await rig.lifecycle._perform(step)
    return rig


def test_a_drain_decided_on_the_boundary_is_not_cancelled_by_its_own_recheck() -> None:
    """The decision and the drain's last look ask one question: at a reading where the one says
    idle long enough, the other agrees (they once did the sum in two orders, and the lifecycle
    spun through drain-cancel pairs until the clock moved on). uvloop's clock reads whole
    milliseconds, so an idle window often ends exactly on a reading; the replay's virtual loop
    holds the clock at one."""
    loop = VirtualLoop(start=22063.784)
    try:
        rig = loop.run_until_complete(_drain_on_the_boundary())
    finally:
        loop.close()
    assert rig.phase is Phase.COLD
    assert rig.backend.calls == ["up", "down"]
