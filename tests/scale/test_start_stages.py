"""A start's stages through the lifecycle, with the fake backend twin telling them and a
fast-forwarded clock: each stage published and timed, a wait for a GPU left out of what is
learned, a start nobody waits for given up after ``abandon_after``, a start that can never
succeed failed at once, and the learned figures kept for the next run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from backends.base import Observation, RequestFacts, StartFailed
from router.config import parse_config
from router.errors import TargetFailed
from router.metrics import Metrics
from router.routing import waiting
from router.scale.lifecycle import Lifecycle
from router.scale.persist import FileStore
from router.scale.state import Phase
from router.scale.targets import TargetRuntime
from tests.fakes import FakeBackend, FakeEngine

pytestmark = pytest.mark.looptime

GET = RequestFacts(method="GET", path="/", is_websocket=False, is_navigation=False)
GPU_BUSY = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


class StagedBackend(FakeBackend):
    """Starts into ``scheduling``; the test moves it on."""

    async def scale_up(self) -> None:
        self.calls.append("up")
        self.set(Observation(running=True, stage="scheduling"))

    def stage(self, stage: str, message: str = "", endpoints: bool = False) -> None:
        ends = (self.endpoint,) if endpoints else ()
        self.set(Observation(running=True, endpoints=ends, stage=stage, stage_message=message))  # type: ignore[arg-type]


class WordyEngine(FakeEngine):
    """An engine whose readiness answer speaks (as the ``/readyz`` node's): its load progress,
    or that its load failed. Records where it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []
        self.failure: str | None = None
        self.progress: float | None = None

    async def probe_ready(self, base_url: str) -> bool:
        self.asked.append(base_url)
        if self.failure is not None:
            raise StartFailed(self.failure)
        return await super().probe_ready(base_url)

    def load_progress(self, base_url: str) -> float | None:
        return self.progress


@asynccontextmanager
async def rig(
    store: FileStore | None = None, engine: FakeEngine | None = None, **scaling: Any
) -> AsyncIterator[TargetRuntime]:
    config = parse_config(
        {
            "targets": {
                "t": {
                    "routes": [{}],
                    "backend": {"kind": "process", "command": ["engine"]},
                    "scaling": {"cold_start_timeout": "10m", **scaling},
                }
            }
        }
    )
    backend, metrics = StagedBackend(), Metrics()
    engine = engine or FakeEngine()
    engine.ready_at = float("inf")
    runtime = TargetRuntime(
        "t", config.targets["t"], backend, engine, metrics, asyncio.get_running_loop()
    )
    runtime.learned.store = store
    lifecycle = Lifecycle(runtime)
    await lifecycle.open()
    try:
        yield runtime
    finally:
        await lifecycle.close()


def staged(runtime: TargetRuntime) -> StagedBackend:
    assert isinstance(runtime.backend, StagedBackend)
    return runtime.backend


def engine(runtime: TargetRuntime) -> FakeEngine:
    assert isinstance(runtime.engine, FakeEngine)
    return runtime.engine


async def until(runtime: TargetRuntime, predicate: Any) -> None:
    async with asyncio.timeout(3600):
        await runtime.cell.wait_for(predicate)


def stage_seconds(runtime: TargetRuntime, stage: str) -> float:
    registry = runtime.metrics.registry
    labels = {"target": "t", "stage": stage}
    return registry.get_sample_value("warmgate_cold_start_stage_seconds_sum", labels) or 0.0


async def test_stages_are_published_timed_and_learned_without_the_wait_for_a_gpu(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path, "t.")
    async with rig(store, expected_cold_start="8s") as rt:
        assert rt.learned.eta(rt.state) == 8.0  # before any start: the config's figure
        loop = asyncio.get_running_loop()
        held = asyncio.ensure_future(rt.acquire(GET))
        await until(rt, lambda s: s.stage == "scheduling")
        await asyncio.sleep(1)
        staged(rt).stage("unschedulable", GPU_BUSY)
        await until(rt, lambda s: s.stage == "unschedulable")
        assert (
            rt.state.stage_message == GPU_BUSY and rt.learned.eta(rt.state) is None
        )  # no ETA without a GPU
        await asyncio.sleep(100)  # every GPU busy for 100 s
        staged(rt).stage("pulling", "pulling ghcr.io/x:1")
        await asyncio.sleep(30)
        staged(rt).stage("loading", endpoints=True)
        engine(rt).ready_at = loop.time() + 5
        result = await held
        assert result.cold and result.waited == pytest.approx(136, abs=1)
    assert stage_seconds(rt, "unschedulable") == pytest.approx(100, abs=0.5)
    assert stage_seconds(rt, "pulling") == pytest.approx(30, abs=0.5)
    assert stage_seconds(rt, "loading") == pytest.approx(5, abs=0.5)
    assert rt.learned.predicted_cold_start() == pytest.approx(
        36, abs=1
    )  # 136 s less 100 s unschedulable
    assert rt.state.stage is None  # ready: a stage belongs to a start

    async with rig(store, expected_cold_start="8s") as again:  # warmgate restarted
        assert again.learned.predicted_cold_start() == pytest.approx(36, abs=1)
        assert again.learned.cold_starts.stage_predicted("pulling") == pytest.approx(30, abs=0.5)


async def test_a_start_nobody_waits_for_is_given_up_after_abandon_after() -> None:
    async with rig(abandon_after="2m") as rt:
        loop = asyncio.get_running_loop()
        held = asyncio.ensure_future(rt.acquire(GET))
        await until(rt, lambda s: s.phase is Phase.STARTING)
        staged(rt).stage("unschedulable", GPU_BUSY)
        await asyncio.sleep(30)
        held.cancel()  # the client went away
        with contextlib.suppress(asyncio.CancelledError):
            await held
        gone_at = loop.time()
        await until(rt, lambda s: s.phase is Phase.COLD)
        assert loop.time() - gone_at == pytest.approx(120, abs=1)
        assert staged(rt).calls == ["up", "down"]
        assert "abandoned" in rt.state.reason
        await asyncio.sleep(600)
        assert staged(rt).calls == ["up", "down"], "not started again with nobody there"


async def test_someone_on_the_waiting_page_keeps_the_start() -> None:
    async with rig(abandon_after="2m") as rt:
        rt.request_start()  # the page was loaded
        await until(rt, lambda s: s.phase is Phase.STARTING)
        for _ in range(10):  # the page polls for five minutes
            await asyncio.sleep(30)
            rt.waited()
        assert rt.state.phase is Phase.STARTING
        await until(rt, lambda s: s.phase is Phase.COLD)  # the tab closed


async def test_a_start_that_cannot_succeed_fails_at_once_and_held_requests_hear_it() -> None:
    async with rig() as rt:
        loop = asyncio.get_running_loop()
        held = asyncio.ensure_future(rt.acquire(GET))
        await until(rt, lambda s: s.phase is Phase.STARTING)
        began = loop.time()
        staged(rt).set(
            Observation(
                running=True,
                failure="ErrImagePull: pull access denied",
                failure_reason="ErrImagePull",
            )
        )
        with pytest.raises(TargetFailed):
            await held
        assert loop.time() - began < 1
        assert rt.state.phase is Phase.FAILED and "ErrImagePull" in rt.state.reason
        assert staged(rt).calls == ["up", "down"]  # no GPU held through the backoff


async def test_the_waiting_page_shows_what_is_left_of_a_start_whose_stages_were_learned() -> None:
    async with rig() as rt:
        rt.learned.cold_start(35.0, {"pulling": 30.0, "loading": 5.0})  # a start learned before
        loop = asyncio.get_running_loop()
        held = asyncio.ensure_future(rt.acquire(GET))
        await until(rt, lambda s: s.stage == "scheduling")
        staged(rt).stage("pulling", "pulling ghcr.io/x:1")
        await until(rt, lambda s: s.stage == "pulling")
        await asyncio.sleep(10)  # a third of the learned pull
        status = waiting.status(rt)
        assert status["eta"] == 35.0 and status["remaining"] == pytest.approx(25, abs=0.5)
        assert status["remaining_by_stage"] == [
            {"stage": "pulling", "seconds": pytest.approx(20, abs=0.5)},
            {"stage": "loading", "seconds": 5.0},
        ]
        left = "about 25 s left: downloading the engine image, then loading the model"
        assert status["expect_text"] == left
        assert status["bar"] == pytest.approx(100 * 10 / 35, abs=2)  # done of what is known
        page = waiting.render(rt).text or ""
        assert left in page and "35 s expected" not in page
        assert "width:28." in page

        staged(rt).stage("loading", endpoints=True)
        engine(rt).ready_at = loop.time() + 5
        await held


async def test_a_failed_start_shows_its_failure_and_reason_on_the_waiting_page() -> None:
    async with rig() as rt:
        held = asyncio.ensure_future(rt.acquire(GET))
        await until(rt, lambda s: s.phase is Phase.STARTING)
        await asyncio.sleep(24)  # most of the 30 s expected: the bar was near 80 %
        staged(rt).set(Observation(running=True, failure="ErrImagePull: pull access denied"))
        with pytest.raises(TargetFailed):
            await held
        status = waiting.status(rt)
        assert status["phase"] == "failed"
        assert "ErrImagePull: pull access denied" in str(status["failure"])
        assert status["bar"] is None and status["expect_text"] == ""
        page = waiting.render(rt).text or ""
        assert "<title>t failed to start</title>" in page
        assert "Starting" not in page.split("<script>")[0]
        assert "ErrImagePull: pull access denied" in page.split("<script>")[0]


POD = "http://10.244.0.7:8188"
"""A pod that runs, its readiness probe failing: asked for the engine's words, never served."""


async def test_a_pod_not_ready_that_says_its_load_failed_fails_the_start_with_its_words() -> None:
    wordy = WordyEngine()
    async with rig(engine=wordy, failure_backoff="10m") as rt:
        loop = asyncio.get_running_loop()
        held = asyncio.ensure_future(rt.acquire(GET))
        await until(rt, lambda s: s.phase is Phase.STARTING)
        staged(rt).set(Observation(running=True, stage="loading", probe_only=(POD,)))
        await asyncio.sleep(20)
        wordy.progress = 0.25
        await until(rt, lambda s: s.progress == 0.25)
        assert waiting.status(rt)["progress"] == 0.25 and rt.state.endpoints == ()
        began = loop.time()
        wordy.failure = "ckpt.safetensors: FileNotFoundError: not found"
        with pytest.raises(TargetFailed) as failed:
            await held
        assert loop.time() - began < 2  # at the next probe, not at cold_start_timeout (10m)
        assert "FileNotFoundError: not found" in str(failed.value)
        assert rt.state.phase is Phase.FAILED and rt.state.reason == wordy.failure
        assert rt.state.retry_at - loop.time() >= 300  # the backoff, as for a process
        assert staged(rt).calls == ["up", "down"]  # no GPU held through the backoff
        assert set(wordy.asked) == {POD}


async def test_a_pod_that_turns_ready_is_served_through_its_endpoint_at_once() -> None:
    wordy = WordyEngine()
    async with rig(engine=wordy) as rt:
        held = asyncio.ensure_future(rt.acquire(GET))
        await until(rt, lambda s: s.phase is Phase.STARTING)
        staged(rt).set(Observation(running=True, stage="loading", probe_only=(POD,)))
        await asyncio.sleep(10)
        wordy.ready_at = 0.0  # the engine says ready on the pod; the cluster not yet
        await asyncio.sleep(10.3)  # between two probes
        assert rt.state.phase is Phase.STARTING  # never served before its endpoint shows
        loop = asyncio.get_running_loop()
        shown = loop.time()
        staged(rt).set(Observation(running=True, endpoints=(staged(rt).endpoint,)))
        result = await held
        assert result.cold and loop.time() - shown < 0.01
        assert rt.state.endpoints == (staged(rt).endpoint,)
