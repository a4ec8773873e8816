"""A target's lifecycle never dies (router/scale/supervision.py): an unexpected exception in any
step of its loop is logged once at ERROR, counted, shown on the target, and the loop goes on, so
an idle GPU is still given back. Each case breaks one step, once or for a while."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from router.dashboard.actions import Actions
from router.dashboard.events import EventBus
from router.dashboard.today import Today
from router.dashboard.view import lifecycle_of
from router.errors import TargetFailed
from router.scale.state import Phase
from tests.rig import Rig
from tests.scale.test_lifecycle import running

pytestmark = pytest.mark.looptime


def breaks(times: int, error: Exception, then: Callable[..., Any]) -> Callable[..., Any]:
    """``then``, but raising ``error`` on its first ``times`` calls."""
    calls = 0

    def broken(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= times:
            raise error
        return then(*args, **kwargs)

    return broken


def break_queue_bookkeeping(rig: Rig, times: int) -> None:
    # What a 401-digit queue_size once did in the engine-queue bookkeeping.
    queue = rig.runtime.queue
    error = OverflowError("int too large to convert to float")
    queue.heard = breaks(times, error, queue.heard)  # type: ignore[method-assign]


def break_timeline(rig: Rig, times: int) -> None:
    timeline = rig.runtime.timeline
    timeline.sample = breaks(times, ValueError("bad sample"), timeline.sample)  # type: ignore[method-assign]


def break_decide(rig: Rig, times: int) -> None:
    lifecycle = rig.lifecycle
    lifecycle.decide = breaks(times, KeyError("no such row"), lifecycle.decide)  # type: ignore[method-assign]


def break_scale_down(rig: Rig, times: int) -> None:
    backend = rig.backend
    down = backend.scale_down
    calls = 0

    async def broken(deadline: float | None = None) -> None:
        nonlocal calls
        calls += 1
        if calls <= times:
            raise RuntimeError("the API server said no")
        await down(deadline)

    backend.scale_down = broken  # type: ignore[method-assign]


BREAKS = {
    "account": break_queue_bookkeeping,
    "account ": break_timeline,
    "decide": break_decide,
    "drain": break_scale_down,
}


@pytest.mark.parametrize("times", [1, 5])
@pytest.mark.parametrize("step", list(BREAKS))
async def test_a_step_that_raises_never_ends_the_loop_and_the_idle_gpu_is_given_back(
    step: str, times: int, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(idle_after="3s", busy_poll="1s") as rig:
        await rig.serve(0.5)
        assert rig.phase is Phase.READY
        BREAKS[step](rig, times)
        with caplog.at_level(logging.INFO, "warmgate.lifecycle"):
            await rig.until(Phase.COLD, limit=600)
        assert "down" in rig.backend.calls
        label = step.strip()
        failed = rig.metric("warmgate_lifecycle_errors_total", step=label)
        assert 1 <= failed <= times  # a release may come before the last break is met
        said = f"lifecycle's {label} step failed"
        errors = [r for r in caplog.records if said in r.getMessage()]
        assert len(errors) == 1 and errors[0].levelno == logging.ERROR, "logged once"
        shown = lifecycle_of(rig.runtime)
        assert shown["running"] is True
        assert shown["last_error"]["step"] == label
        assert 1 <= shown["last_error"]["repeats"] <= failed  # in a row: a pass between resets it
        # and it keeps serving: the next request starts it again
        await rig.serve(0.1)
        assert rig.phase is Phase.READY


async def test_a_start_whose_probe_raises_fails_and_the_next_start_is_released_when_idle() -> None:
    async with running(idle_after="3s") as rig:
        engine = rig.engine
        error = AttributeError("'NoneType' object has no attribute 'get'")
        engine.probe_ready = breaks(1, error, engine.probe_ready)  # type: ignore[method-assign]
        with pytest.raises(TargetFailed):  # held requests are told, not left waiting
            await rig.serve(0.1)
        assert rig.metric("warmgate_lifecycle_errors_total", step="probe") == 1
        await asyncio.sleep(rig.runtime.state.retry_at - rig.runtime.loop.time() + 1)
        await rig.serve(0.1)
        await rig.until(Phase.COLD, limit=600)
        assert rig.backend.calls[-1] == "down"


async def test_an_operator_action_on_a_target_whose_loop_is_not_running_says_so() -> None:
    async with running() as rig:
        task = rig.runtime.supervisor.task
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        today = Today(["t"], loop.time(), rig.metrics.gpu_seconds)
        actions = Actions("token", {"t": rig.runtime}, EventBus(today, loop))
        for action in ("release", "wake"):
            response = await actions.handle(_request(action))
            assert response.status == 503
            assert b"lifecycle_stopped" in response.body  # type: ignore[operator]
        assert rig.runtime.release_asked is False
        assert lifecycle_of(rig.runtime)["running"] is False


def _request(action: str) -> Any:
    from aiohttp.test_utils import make_mocked_request

    request = make_mocked_request(
        "POST",
        f"/targets/t/{action}",
        headers={"Authorization": "Bearer token"},
        match_info={"name": "t", "action": action},
    )
    return request
