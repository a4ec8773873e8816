"""Playbooks of a target's lifecycle (as mitmproxy's proxy layers are tested): a real
:class:`Lifecycle` over the fake backend and engine twins on a fast-forwarded clock, every event
recorded as :meth:`Machine.apply` makes it, with the step that applied it and the phase after;
each play is asserted whole, in order. Each event is one its step lists
(:data:`router.scale.steps.STEPS`), and a metric a step counts is counted by the steps alone."""

from __future__ import annotations

import asyncio
import re

import pytest

from backends.base import Observation
from router.errors import TargetFailed
from router.scale.lifecycle import Lifecycle
from router.scale.machine import Event, Machine
from router.scale.scaling import Act, Step
from router.scale.state import Phase, TargetState
from router.scale.steps import STEPS
from tests.cluster.test_replicas import Leading, ready_rig
from tests.fakes import FakeParkingEngine
from tests.helpers import ROOT
from tests.scale.test_lifecycle import running
from tests.scale.test_parked_lifecycle import one

pytestmark = pytest.mark.looptime


Play = list[tuple[str, str, str]]
"""(the step under way, or ``-`` outside one; the event; the phase after it)."""


@pytest.fixture
def played(monkeypatch: pytest.MonkeyPatch) -> Play:
    seen: Play = []
    doing = ["-"]
    apply, perform = Machine.apply, Lifecycle._perform

    def recorded(
        self: Machine, event: Event, reason: str | None = None, **reported: object
    ) -> TargetState:
        state = apply(self, event, reason, **reported)
        seen.append((doing[-1], event.value, state.phase.value))
        return state

    async def performing(self: Lifecycle, step: Step) -> None:
        doing.append(step.act.value)
        try:
            await perform(self, step)
        finally:
            doing.pop()

    monkeypatch.setattr(Machine, "apply", recorded)
    monkeypatch.setattr(Lifecycle, "_perform", performing)
    return seen


def check(seen: Play, expected: Play) -> None:
    assert seen == expected
    for step, event, _ in seen:
        if step != "-":
            assert Event(event) in STEPS[Act(step)].applies, (step, event)


START = [("start", "start", "starting"), ("probe", "ready", "ready")]
RELEASE = [
    ("drain", "drain", "draining"),
    ("drain", "commit", "draining"),
    ("drain", "released", "cold"),
]


async def test_a_release(played: Play) -> None:
    async with running() as rig:
        await rig.serve(1)
        await rig.until(Phase.COLD)
        check(played, [*START, *RELEASE])
        assert rig.backend.calls == ["up", "down"]
        assert rig.metric("warmgate_idle_releases_total") == 1


async def test_a_park_and_a_wake(played: Play) -> None:
    async with one() as rig:
        await rig.serve(1)
        await rig.until(Phase.PARKED)
        check(played, [*START, ("park", "park", "parked"), ("park", "parked", "parked")])
        played.clear()
        await rig.serve(1)
        check(played, [("wake", "wake", "parked"), ("probe", "woke", "ready")])
        assert isinstance(rig.engine, FakeParkingEngine)
        assert rig.engine.calls == ["park", "wake"]
        assert rig.metric("warmgate_parks_total", target="t") == 1


async def test_a_failed_start(played: Play) -> None:
    async with running(start_retries=0) as rig:
        rig.backend.fail_start = "exited with code 1"
        with pytest.raises(TargetFailed):
            await rig.serve(1)
        check(played, [("start", "start", "starting"), ("fail", "fail", "failed")])
        assert rig.runtime.state.failures == 1
        assert rig.backend.calls == ["up", "down"], "what is left of it reaped"


async def test_a_workload_that_exits_while_starting_is_started_again_once(played: Play) -> None:
    async with running(start_retries=1) as rig:
        rig.backend.fail_start = "exited with code 1"
        with pytest.raises(TargetFailed):
            await rig.serve(1)
        check(
            played,
            [
                ("start", "start", "starting"),
                ("restart", "restart", "starting"),
                ("fail", "fail", "failed"),
            ],
        )
        assert rig.backend.calls == ["up", "down", "up", "down"]


async def test_a_release_fenced_by_the_leader(played: Play) -> None:
    async with ready_rig() as rig:
        played.clear()
        await asyncio.sleep(61)
        assert rig.lifecycle.fence(asyncio.get_running_loop().time() + 10, "warmgate-0") is None
        rig.backend.set(Observation())  # the leader's scale-down shows in the cluster
        await rig.until(Phase.COLD)
        check(played, [("-", "fence", "draining"), ("lost", "lost", "cold")])
        assert rig.runtime.state.reason == "released by warmgate-0"


async def test_a_release_by_the_leader_with_the_others_fenced(played: Play) -> None:
    async with ready_rig(Leading()) as rig:
        played.clear()
        await rig.until(Phase.COLD)
        check(played, RELEASE)
        assert rig.metric("warmgate_idle_releases_total") == 1


def test_every_decided_step_has_one_and_its_metrics_are_counted_there_alone() -> None:
    assert set(STEPS) == set(Act) - {Act.WAIT, Act.FENCE}
    counted = {name for kind in STEPS.values() for name in kind.counts}
    steps = ROOT / "router" / "scale" / "steps.py"
    for path in sorted((ROOT / "router").rglob("*.py")):
        for name in counted:
            if re.search(rf"\bmetrics\.{name}\.labels\(", path.read_text()):
                assert path == steps, (name, path)
