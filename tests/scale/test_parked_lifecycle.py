"""The parked tier and GPU pools in the lifecycle, with fake backend and engine twins and a
fast-forwarded loop clock: park after idle, wake on work, never a park with work in flight, a
failed park or wake falls back to a stop, and targets taking turns on a full pool."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest

from backends.base import RequestFacts
from router.config import parse_config
from router.errors import HoldTimeout, TargetAsleep
from router.metrics import Metrics
from router.scale.lifecycle import Lifecycle
from router.scale.pool_runtime import PoolRuntime
from router.scale.state import Phase
from router.scale.targets import TargetRuntime
from tests.fakes import FakeBackend, FakeEngine, FakeParkingEngine
from tests.rig import Rig

pytestmark = pytest.mark.looptime


def target(**kw: Any) -> dict[str, Any]:
    scaling = {"idle_after": "30m", "park_after": "5m", "cold_start_timeout": "5m"}
    scaling.update(kw.pop("scaling", {}))
    return {
        "engine": "comfyui",
        "routes": [{"path_prefix": f"/{kw.get('name', 't')}"}],
        "backend": {"kind": "process", "command": ["engine"]},
        "scaling": scaling,
        **{k: v for k, v in kw.items() if k != "name"},
    }


@asynccontextmanager
async def rigs(
    targets: dict[str, dict[str, Any]],
    pools: dict[str, Any] | None = None,
    parks: bool | dict[str, bool] = True,
) -> AsyncIterator[dict[str, Rig]]:
    """Runtimes, lifecycles and pools as the wiring makes them, started inside the test (so
    their timers run on its fast-forwarded clock)."""
    config = parse_config({"targets": targets, "pools": pools or {}})
    loop, metrics = asyncio.get_running_loop(), Metrics()
    out: dict[str, Rig] = {}
    for i, (name, spec) in enumerate(config.targets.items()):
        can = parks if isinstance(parks, bool) else parks.get(name, True)
        backend = FakeBackend(f"http://127.0.0.1:{i + 1}")
        engine = FakeParkingEngine() if can else FakeEngine()
        runtime = TargetRuntime(name, spec, backend, engine, metrics, loop)
        out[name] = Rig(runtime, backend, engine, Lifecycle(runtime), metrics)
    for pool, spec in config.pools.items():
        members = [out[n].runtime for n, t in config.targets.items() if t.pool == pool]
        PoolRuntime(pool, spec, members, metrics, loop)
    async with AsyncExitStack() as stack:
        for rig in out.values():
            await rig.lifecycle.open()
            stack.push_async_callback(rig.lifecycle.close)
        yield out


@asynccontextmanager
async def one(**kw: Any) -> AsyncIterator[Rig]:
    async with rigs({"t": target(**kw)}) as all_:
        yield all_["t"]


def parking(rig: Rig) -> FakeParkingEngine:
    assert isinstance(rig.engine, FakeParkingEngine)
    return rig.engine


# -- one target ---------------------------------------------------------------------------------


async def test_parked_after_park_after_and_woken_by_the_next_request_without_a_restart() -> None:
    async with one() as rig:
        await rig.serve(1)
        idle_from = rig.runtime.loop.time()
        await rig.until(Phase.PARKED)
        assert 300 <= rig.runtime.loop.time() - idle_from < 302
        assert parking(rig).calls == ["park"] and rig.backend.calls == ["up"]
        assert rig.runtime.state.endpoints, "the process stays, with its address"
        await asyncio.sleep(600)
        waited = await rig.serve(0)
        assert 1.0 <= waited < 1.5, "a wake: the engine's reload, not a cold start"
        assert parking(rig).calls == ["park", "wake"]
        assert rig.backend.calls == ["up"], "the same process: no restart"
        assert rig.runtime.state.reason.startswith("woke in")
        assert rig.metric("warmgate_parks_total", target="t") == 1
        assert rig.metric("warmgate_wake_seconds_count", target="t") == 1
        assert rig.metric("warmgate_cold_starts_total", target="t") == 1
        assert rig.metric("warmgate_gpu_seconds_total", target="t", state="parked") >= 590
        assert rig.runtime.learned.wakes.predicted() == pytest.approx(1.0, abs=0.3)


async def test_idle_after_still_stops_a_parked_target() -> None:
    async with one() as rig:
        await rig.serve(0)
        await rig.until(Phase.PARKED)
        await rig.until(Phase.COLD)
        assert rig.backend.calls == ["up", "down"]
        assert rig.runtime.state.reason.startswith("parked, idle for 18")


async def test_never_parked_while_a_request_or_the_engine_queue_is_busy() -> None:
    async with one() as rig:
        long = rig.serve(3600)  # an hour-long render through one request
        await asyncio.sleep(1800)
        assert rig.phase is Phase.READY and parking(rig).calls == []
        await long
        rig.engine.busy_now = True  # then a render in the engine's own queue, no HTTP
        await asyncio.sleep(1800)
        assert rig.phase is Phase.READY and parking(rig).calls == []
        rig.engine.busy_now = False
        await rig.until(Phase.PARKED)


async def test_a_request_during_the_park_is_held_and_wakes_it() -> None:
    async with one() as rig:
        parking(rig).park_seconds = 3.0
        await rig.serve(0)
        async with asyncio.timeout(600):
            await rig.runtime.cell.wait_for(lambda s: s.parking)
        late = rig.serve(0)
        assert await late >= 1.0, "held through the park and the wake"
        assert parking(rig).calls == ["park", "wake"] and rig.backend.calls == ["up"]


async def test_a_websocket_during_the_park_is_told_parked_and_after_it_forwarded() -> None:
    """What may not wake a parked target: refused in the words of its phase while the park is
    made (never "scaled to zero"), forwarded to the parked process once it is done."""
    socket = RequestFacts(method="GET", path="/ws", is_websocket=True, is_navigation=False)
    async with one() as rig:
        parking(rig).park_seconds = 3.0
        await rig.serve(0)
        async with asyncio.timeout(600):
            await rig.runtime.cell.wait_for(lambda s: s.parking)
        with pytest.raises(TargetAsleep) as asleep:
            await rig.runtime.acquire(socket)
        assert "is parked; this request does not wake it" in asleep.value.message
        assert "scaled to zero" not in asleep.value.message
        async with asyncio.timeout(600):
            await rig.runtime.cell.wait_for(lambda s: s.phase is Phase.PARKED and not s.parking)
        held = await rig.runtime.acquire(socket)
        assert (held.state.phase, held.cold) == (Phase.PARKED, False)
        assert not rig.runtime.state.waking and parking(rig).calls == ["park"]


async def test_a_failed_park_stops_the_target_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with one() as rig:
        parking(rig).fail_park = "POST /free answered 500: boom"
        await rig.serve(0)
        with caplog.at_level(logging.WARNING, "warmgate.lifecycle"):
            await rig.until(Phase.COLD)
        assert rig.backend.calls == ["up", "down"]
        assert "the park failed (POST /free answered 500: boom); stopping it instead" in caplog.text


async def test_a_failed_wake_stops_the_target_and_the_request_gets_a_cold_start() -> None:
    async with one() as rig:
        await rig.serve(0)
        await rig.until(Phase.PARKED)
        parking(rig).fail_wake = "POST /wake_up answered 500"
        assert await rig.serve(0) >= 0
        assert rig.phase is Phase.READY
        assert rig.backend.calls == ["up", "down", "up"]
        assert rig.runtime.state.reason.startswith("ready after")


async def test_a_wake_that_never_ends_is_stopped_after_cold_start_timeout() -> None:
    async with one(scaling={"cold_start_timeout": "1m"}) as rig:
        await rig.serve(0)
        await rig.until(Phase.PARKED)
        rig.engine.ready_at = float("inf")
        parking(rig).wake_seconds = float("inf")
        with pytest.raises(HoldTimeout):
            await rig.serve(0)
        assert rig.backend.calls[:2] == ["up", "down"]


async def test_the_dashboard_park_parks_an_idle_target_at_once() -> None:
    async with one(scaling={"park_after": "0s"}) as rig:
        await rig.serve(0)
        await asyncio.sleep(5)
        assert rig.phase is Phase.READY, "park_after 0: never parked by idleness"
        rig.runtime.park_asked = True
        rig.runtime.nudge.set()
        await rig.until(Phase.PARKED)
        assert not rig.runtime.park_asked


# -- pools --------------------------------------------------------------------------------------

POOL = {"ws": {"capacity": 1, "yield_after": "30s"}}


async def test_a_full_pool_parks_the_idle_target_and_starts_the_newcomer() -> None:
    targets = {
        "comfyui": target(name="comfyui", pool="ws"),
        "wan2gp": target(name="wan2gp", pool="ws"),
    }
    async with rigs(targets, POOL) as r:
        comfy, wan = r["comfyui"], r["wan2gp"]
        await comfy.serve(0)
        await asyncio.sleep(5)
        render = wan.serve(0)  # comfyui idle for only 5 s: wan2gp waits for it
        await wan.runtime.cell.wait_for(lambda s: bool(s.waiting_for))
        assert wan.runtime.state.waiting_for == (
            "waiting for the GPU (ws): comfyui is in use (idle for less than 30s)"
        )
        assert await render >= 25
        assert comfy.phase is Phase.PARKED and parking(comfy).calls == ["park"]
        assert comfy.runtime.state.reason == "making room for wan2gp in its pool"
        assert (
            comfy.metric(
                "warmgate_pool_displacements_total", pool="ws", target="comfyui", how="park"
            )
            == 1
        )
        assert wan.metric("warmgate_pool_waits_total", pool="ws", target="wan2gp") == 1
        assert wan.runtime.state.waiting_for == ""
        # and back: comfyui wakes once wan2gp idled for yield_after
        assert await comfy.serve(0) >= 25
        assert wan.phase is Phase.PARKED and comfy.backend.calls == ["up"]


async def test_displacement_takes_the_lowest_priority_then_the_longest_idle() -> None:
    targets = {
        "high": target(name="high", pool="ws", priority=10),
        "low-old": target(name="low-old", pool="ws", priority=1),
        "low-new": target(name="low-new", pool="ws", priority=1),
        "newcomer": target(name="newcomer", pool="ws", priority=5),
    }
    pools = {"ws": {"capacity": 3, "yield_after": "30s"}}
    async with rigs(targets, pools) as r:
        await r["high"].serve(0)
        await r["low-old"].serve(0)
        await asyncio.sleep(20)
        await r["low-new"].serve(0)
        await asyncio.sleep(60)  # every resident idle for over yield_after
        await r["newcomer"].serve(0)
        assert r["low-old"].phase is Phase.PARKED
        assert r["high"].phase is Phase.READY and r["low-new"].phase is Phase.READY


async def test_a_busy_pool_holds_the_newcomer_until_the_work_ends_and_stops_what_cannot_park() -> (
    None
):
    targets = {"wan2gp": target(name="wan2gp", pool="ws", engine="gradio",
                                scaling={"park_after": "0s"}),
               "comfyui": target(name="comfyui", pool="ws",
                                 scaling={"cold_start_timeout": "20m"})}  # fmt: skip
    async with rigs(targets, POOL, parks={"wan2gp": False}) as r:
        wan, comfy = r["wan2gp"], r["comfyui"]
        render = wan.serve(600)  # a ten-minute video render
        await wan.until(Phase.READY)
        held = comfy.serve(0)
        await asyncio.sleep(300)
        assert not held.done() and comfy.phase is Phase.COLD
        assert (
            comfy.runtime.state.waiting_for
            == "waiting for the GPU (ws): wan2gp is serving 1 request"
        )
        await render
        assert await held >= 600 + 30, "the render finished, then yield_after passed"
        assert wan.phase is Phase.COLD and wan.backend.calls == ["up", "down"]
        assert (
            wan.metric("warmgate_pool_displacements_total", pool="ws", target="wan2gp", how="stop")
            == 1
        )
        assert comfy.metric("warmgate_pool_resident", pool="ws") == 1


async def test_a_hold_past_its_deadline_says_what_it_waited_for() -> None:
    targets = {"wan2gp": target(name="wan2gp", pool="ws"), "comfyui": target(name="comfyui",
               pool="ws", scaling={"cold_start_timeout": "2m"})}  # fmt: skip
    async with rigs(targets, POOL) as r:
        render = r["wan2gp"].serve(600)
        await r["wan2gp"].until(Phase.READY)
        with pytest.raises(HoldTimeout, match=r"waiting for the GPU \(ws\): wan2gp is serving"):
            await r["comfyui"].serve(0)
        await render


# -- several replicas ---------------------------------------------------------------------------


class Others:
    """The other warmgate replicas, as the leader's lifecycle sees them: idle as this one is,
    and every fence taken; records what it was asked."""

    fence_timeout = 10.0
    poll_interval = 1.0

    def __init__(self, runtime: TargetRuntime) -> None:
        self.runtime = runtime
        self.asked: list[tuple[str, Any]] = []

    def idle_since(self, target: str) -> float | None:
        return self.runtime.activity.idle_since(self.runtime.spec.scaling.stream_activity_window)

    def wanted(self, target: str) -> bool:
        return False

    def leading(self) -> bool:
        return True

    async def confirm_leading(self) -> bool:
        return True

    async def fence_others(self, target: str, needed: float | None = None) -> str | None:
        self.asked.append(("fence", needed))
        return None

    async def unfence_others(self, target: str) -> None:
        self.asked.append(("unfence", None))

    async def parked_others(self, target: str) -> None:
        self.asked.append(("parked", None))

    def add_fenceable(self, target: str, fenceable: Any) -> None:
        pass


async def test_the_leader_parks_with_the_others_fenced_for_park_after_then_tells_them() -> None:
    config = parse_config({"targets": {"t": target()}})
    loop, metrics = asyncio.get_running_loop(), Metrics()
    backend, engine = FakeBackend(), FakeParkingEngine()
    runtime = TargetRuntime("t", config.targets["t"], backend, engine, metrics, loop)
    others = Others(runtime)
    lifecycle = Lifecycle(runtime, others)
    rig = Rig(runtime, backend, engine, lifecycle, metrics)
    await lifecycle.open()
    try:
        await rig.serve(0)
        await rig.until(Phase.PARKED)
        assert others.asked == [("fence", 300.0), ("parked", None)]
        assert engine.calls == ["park"] and backend.calls == ["up"]
    finally:
        await lifecycle.close()


async def test_a_replica_fenced_for_the_leaders_park_is_parked_and_wakes_it_here() -> None:
    async with one() as rig:
        await rig.serve(0)
        await asyncio.sleep(60)
        loop = asyncio.get_running_loop()
        refused = rig.lifecycle.fence(loop.time() + 10, "warmgate-0")
        assert refused is not None and "idle for only" in refused, "a release's idle_after"
        assert rig.lifecycle.fence(loop.time() + 10, "warmgate-0", needed=30.0) is None
        assert rig.phase is Phase.DRAINING and rig.runtime.state.stopping
        held = rig.serve(0)  # arrives while the leader parks
        await asyncio.sleep(1)
        assert not held.done()
        rig.lifecycle.unfence(parked=True)
        assert rig.runtime.state.reason == "parked by warmgate-0"
        assert await held >= 1
        assert parking(rig).calls == ["wake"], "woken here; parked by the leader"
        assert rig.backend.calls == ["up"] and rig.phase is Phase.READY
