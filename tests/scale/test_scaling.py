"""The lifecycle's pure decision: a table of (snapshot, now) -> step, no I/O."""

from __future__ import annotations

import pytest

from backends.base import Observation
from router.config import Scaling
from router.scale.scaling import Act, View, backoff, decide
from router.scale.state import Phase, TargetState

S = Scaling(idle_after=1800, cold_start_timeout=300, failure_backoff=10, failure_backoff_max=300)
UP = Observation(running=True, endpoints=("http://127.0.0.1:1",))
DOWN = Observation()
CRASHED = Observation(failure="exited with code 1", crashed=True)


def state(phase: Phase, since: float = 0.0, **kw: object) -> TargetState:
    if phase is Phase.READY:  # ready is never published without an endpoint
        kw.setdefault("endpoints", UP.endpoints)
    return TargetState(phase, since, **kw)  # type: ignore[arg-type]


CASES = [
    ("cold, nobody waiting", View(state(Phase.COLD), DOWN, S, now=10), Act.WAIT),
    ("cold, a request held", View(state(Phase.COLD), DOWN, S, now=10, held=1), Act.START),
    ("cold, asked to warm", View(state(Phase.COLD), DOWN, S, now=10, wanted=True), Act.START),
    ("always on never acts", View(state(Phase.READY), UP, S, now=1e9, always_on=True), Act.WAIT),
    ("starting, not up yet", View(state(Phase.STARTING), DOWN, S, now=5), Act.WAIT),
    ("starting, probe due", View(state(Phase.STARTING), UP, S, now=5, next_probe=5), Act.PROBE),
    (
        "starting, loading, probe later",
        View(state(Phase.STARTING, stage="loading"), UP, S, now=5, next_probe=6),
        Act.WAIT,
    ),
    (
        "starting, up: now loading",
        View(state(Phase.STARTING), UP, S, now=5, next_probe=6),
        Act.STAGE,
    ),
    ("starting, crashed", View(state(Phase.STARTING), CRASHED, S, now=5), Act.FAIL),
    (
        "starting, crashed, a request held",
        View(state(Phase.STARTING), CRASHED, S, now=5, held=1),
        Act.RESTART,
    ),
    (
        "starting, crashed, the waiting page open",
        View(state(Phase.STARTING), CRASHED, S, now=5, wanted=True),
        Act.RESTART,
    ),
    (
        "starting, crashed again, retries spent",
        View(state(Phase.STARTING, restarts=1), CRASHED, S, now=5, held=1),
        Act.FAIL,
    ),
    (
        "starting, crashed, held past its timeout",
        View(state(Phase.STARTING), CRASHED, S, now=300, held=1),
        Act.FAIL,
    ),
    (
        "starting, a failure it did not exit of",
        View(state(Phase.STARTING), Observation(failure="ErrImagePull: no"), S, now=5, held=1),
        Act.FAIL,
    ),
    ("starting, too long", View(state(Phase.STARTING), UP, S, now=300, next_probe=400), Act.FAIL),
    ("ready, in flight", View(state(Phase.READY), UP, S, now=9999, idle_since=None), Act.WAIT),
    ("ready, idle 29m", View(state(Phase.READY), UP, S, now=1740, idle_since=0), Act.WAIT),
    ("ready, idle 30m", View(state(Phase.READY), UP, S, now=1800, idle_since=0), Act.DRAIN),
    (
        "ready, idle but held",
        View(state(Phase.READY), UP, S, now=1e4, idle_since=0, held=1),
        Act.WAIT,
    ),
    ("ready, crashed", View(state(Phase.READY), CRASHED, S, now=5), Act.LOST),
    ("ready, stopped", View(state(Phase.READY), DOWN, S, now=5), Act.LOST),
    ("draining, performing", View(state(Phase.DRAINING), UP, S, now=5, idle_since=0), Act.WAIT),
    (
        "failed, backing off",
        View(state(Phase.FAILED, retry_at=20), DOWN, S, now=10, held=1),
        Act.WAIT,
    ),
    (
        "failed, retry due",
        View(state(Phase.FAILED, retry_at=20), DOWN, S, now=20, held=1),
        Act.START,
    ),
    ("failed, nobody asks", View(state(Phase.FAILED, retry_at=20), DOWN, S, now=30), Act.WAIT),
]


@pytest.mark.parametrize(("name", "view", "act"), CASES, ids=[c[0] for c in CASES])
def test_decide(name: str, view: View, act: Act) -> None:
    assert decide(view).act is act


def test_wait_says_until_when() -> None:
    assert decide(View(state(Phase.READY), UP, S, now=100, idle_since=50)).until == 1850
    assert decide(View(state(Phase.FAILED, retry_at=42), DOWN, S, now=1)).until == 42
    loading = state(Phase.STARTING, since=0, stage="loading")
    step = decide(View(loading, UP, S, now=1, next_probe=1.2))
    assert step.act is Act.WAIT and step.until == 1.2


def test_backoff_doubles_and_caps() -> None:
    assert [backoff(n, S) for n in (1, 2, 3, 4, 5, 6, 7)] == [10, 20, 40, 80, 160, 300, 300]


TWO = Observation(running=True, endpoints=("http://10.0.0.2:8188", "http://10.0.0.3:8188"))
ONE = Observation(running=True, endpoints=("http://10.0.0.3:8188",))
NO_PODS = Observation(running=True)


def ready_on(obs: Observation) -> TargetState:
    return state(Phase.READY, endpoints=obs.endpoints)


ENDPOINT_CASES = [
    ("cold, found running", View(state(Phase.COLD), UP, S, now=10), Act.ADOPT),
    ("cold, found starting", View(state(Phase.COLD), NO_PODS, S, now=10), Act.ADOPT),
    ("cold, crashed is no adoption", View(state(Phase.COLD), CRASHED, S, now=10), Act.WAIT),
    ("ready, same endpoints", View(ready_on(TWO), TWO, S, now=10, idle_since=5), Act.WAIT),
    ("ready, a pod gone", View(ready_on(TWO), ONE, S, now=10, idle_since=5), Act.REFRESH),
    ("ready, a pod came", View(ready_on(ONE), TWO, S, now=10, idle_since=5), Act.REFRESH),
    ("ready, all pods gone", View(ready_on(TWO), NO_PODS, S, now=10), Act.REFRESH),
    ("ready with none published", View(ready_on(NO_PODS), NO_PODS, S, now=10), Act.REFRESH),
    ("ready, scaled to zero", View(ready_on(TWO), DOWN, S, now=10), Act.LOST),
    (
        "draining, a pod gone",
        View(state(Phase.DRAINING, endpoints=TWO.endpoints), ONE, S, now=10),
        Act.WAIT,
    ),
]


@pytest.mark.parametrize(
    ("name", "view", "act"), ENDPOINT_CASES, ids=[c[0] for c in ENDPOINT_CASES]
)
def test_decide_follows_the_backends_endpoints(name: str, view: View, act: Act) -> None:
    assert decide(view).act is act


def test_a_start_that_exited_fails_with_its_own_last_error_told() -> None:
    said = "ValueError: When localhost is not accessible, a shareable link must be created."
    exited = Observation(failure="exited with code 1", crashed=True, last_error=said)
    step = decide(View(state(Phase.STARTING, restarts=1), exited, S, now=5, held=1))
    assert step.act is Act.FAIL and step.told == said
    assert step.reason == f"exited with code 1: {said}"
    again = decide(View(state(Phase.STARTING), exited, S, now=5, held=1))
    assert again.act is Act.RESTART and said in again.reason and "1 of 1" in again.reason
