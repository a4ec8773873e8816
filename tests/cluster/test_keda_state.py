"""What KEDA is told, and the lifecycle's steps in ``mode: keda``: pure functions, as tables."""

from __future__ import annotations

import math
from typing import Any

import pytest

from backends.base import Backend, Observation
from backends.registry import make_backend
from router.cluster.keda_state import RECHECK_HELD, Wants, activeness, target_concurrency
from router.config import Scaling, parse_config
from router.scale.keda_mode import decide_keda, keda_owns_replicas
from router.scale.scaling import Act, View
from router.scale.state import Phase, TargetState

NOW = 10_000.0
IDLE = 1800.0


def state(phase: Phase, **changes: Any) -> TargetState:
    return TargetState(phase, changes.pop("since", NOW - 5), **changes)


def wants(phase: Phase, **fields: Any) -> Wants:
    changes = fields.pop("state", {})
    fields.setdefault("idle_since", NOW - 60)
    return Wants(state=state(phase, **changes), now=NOW, idle_after=IDLE, **fields)


# (case, wants, active, metric, recheck_at)
ACTIVENESS = [
    ("cold: scaled to zero", wants(Phase.COLD), False, 0, math.inf),
    ("cold, one held: active at once", wants(Phase.COLD, held=1), True, 1, NOW + RECHECK_HELD),
    ("cold, asked to warm up", wants(Phase.COLD, wanted_until=NOW + 30), True, 0, NOW + 30),
    ("cold, a warm-up ask ran out", wants(Phase.COLD, wanted_until=NOW - 1), False, 0, math.inf),
    ("starting, held requests", wants(Phase.STARTING, held=7), True, 7, math.inf),
    ("starting, the holds gave up", wants(Phase.STARTING), True, 0, math.inf),
    ("ready, in flight", wants(Phase.READY, in_flight=3, idle_since=None), True, 3, NOW + IDLE),
    ("ready, in flight + held", wants(Phase.READY, in_flight=2, held=1), True, 3, math.inf),
    ("ready, within its idle window", wants(Phase.READY), True, 0, NOW - 60 + IDLE),
    (
        "ready, an engine busy (idle_since pushed forward)",
        wants(Phase.READY, idle_since=NOW + 2),
        True,
        0,
        NOW + 2 + IDLE,
    ),
    ("ready, idle_after passed", wants(Phase.READY, idle_since=NOW - IDLE), False, 0, math.inf),
    (
        "draining, last busy check: still the idle rule",
        wants(Phase.DRAINING, idle_since=NOW - IDLE - 1),
        False,
        0,
        math.inf,
    ),
    (
        "draining, drain cancelled by a busy engine",
        wants(Phase.DRAINING, idle_since=NOW),
        True,
        0,
        NOW + IDLE,
    ),
    (
        "draining, stop committed",
        wants(Phase.DRAINING, idle_since=NOW - IDLE - 1, state={"stopping": True}),
        False,
        0,
        math.inf,
    ),
    (
        "draining, stop committed, another replica active meanwhile",
        wants(Phase.DRAINING, idle_since=None, state={"stopping": True}),
        True,
        0,
        NOW + IDLE,
    ),
    (
        "draining, stop committed, another replica active a minute ago",
        wants(Phase.DRAINING, idle_since=NOW - 60, state={"stopping": True}),
        True,
        0,
        NOW - 60 + IDLE,
    ),
    (
        "draining, stop committed, then a request held",
        wants(Phase.DRAINING, held=1, state={"stopping": True}),
        True,
        1,
        math.inf,
    ),
    (
        "failed, in backoff",
        wants(Phase.FAILED, wanted_until=NOW + 99, state={"retry_at": NOW + 20}),
        False,
        0,
        NOW + 20,
    ),
    ("failed, backoff over, held", wants(Phase.FAILED, held=1), True, 1, NOW + RECHECK_HELD),
    ("failed, backoff over, nobody", wants(Phase.FAILED), False, 0, math.inf),
]


@pytest.mark.parametrize(
    ("wanted", "active", "metric", "recheck_at"),
    [case[1:] for case in ACTIVENESS],
    ids=[case[0] for case in ACTIVENESS],
)
def test_activeness(wanted: Wants, active: bool, metric: int, recheck_at: float) -> None:
    answer = activeness(wanted)
    assert (answer.active, answer.metric, answer.recheck_at) == (active, metric, recheck_at)
    assert answer.reason


def test_inactive_exactly_when_the_lifecycle_would_drain() -> None:
    """The idle window's end is the same instant for the scaler and for ``decide``."""
    before = activeness(wants(Phase.READY, idle_since=NOW - IDLE + 0.01))
    at = activeness(wants(Phase.READY, idle_since=NOW - IDLE))
    assert (before.active, before.recheck_at) == (True, NOW + 0.01)
    assert not at.active


# -- decide_keda ------------------------------------------------------------------------------

RUNNING = Observation(running=True, endpoints=("http://10.0.0.7:8188",))
GONE = Observation()
SCALING = Scaling(idle_after=IDLE, cold_start_timeout=300)


def view(phase: Phase, obs: Observation, **fields: Any) -> View:
    changes = fields.pop("state", {})
    fields.setdefault("idle_since", NOW - 60)
    return View(state=state(phase, **changes), observation=obs, scaling=SCALING, now=NOW, **fields)


# (case, view, act, words in the reason)
DECISIONS = [
    ("cold, a request held: start (publish only)", view(Phase.COLD, GONE, held=1), Act.START, ""),
    ("cold, KEDA scaled it up: adopt", view(Phase.COLD, RUNNING), Act.ADOPT, ""),
    ("cold, nobody: wait", view(Phase.COLD, GONE), Act.WAIT, ""),
    ("starting, replica up: probe", view(Phase.STARTING, RUNNING), Act.PROBE, ""),
    ("starting, no replica yet: wait", view(Phase.STARTING, GONE), Act.WAIT, ""),
    (
        "starting, KEDA never scaled: fail, naming KEDA",
        view(Phase.STARTING, GONE, state={"since": NOW - 301}),
        Act.FAIL,
        "KEDA added no ready replica within 300s",
    ),
    (
        "starting, the pod crashed: fail with its reason",
        view(Phase.STARTING, Observation(failure="CrashLoopBackOff", crashed=True)),
        Act.FAIL,
        "CrashLoopBackOff",
    ),
    (
        "ready, idle long enough: drain",
        view(Phase.READY, RUNNING, idle_since=NOW - IDLE, state={"endpoints": RUNNING.endpoints}),
        Act.DRAIN,
        "",
    ),
    (
        "draining, stop committed, replicas still up: wait for KEDA",
        view(Phase.DRAINING, RUNNING, idle_since=NOW - IDLE, state={"stopping": True}),
        Act.WAIT,
        "",
    ),
    (
        "draining, stop committed, KEDA scaled to zero: cold",
        view(Phase.DRAINING, GONE, idle_since=NOW - IDLE, state={"stopping": True}),
        Act.LOST,
        "KEDA scaled it to zero",
    ),
    (
        "draining, stop committed, a request held: adopt the replica KEDA keeps",
        view(Phase.DRAINING, RUNNING, held=1, idle_since=NOW - IDLE, state={"stopping": True}),
        Act.ADOPT,
        "while KEDA was scaling it down",
    ),
    (
        "draining, stop committed, another replica active meanwhile: adopt again",
        view(Phase.DRAINING, RUNNING, idle_since=NOW - 60, state={"stopping": True}),
        Act.ADOPT,
        "active on another replica",
    ),
    (
        "draining, stop committed, held, replica gone: cold (then start)",
        view(Phase.DRAINING, GONE, held=1, idle_since=NOW - IDLE, state={"stopping": True}),
        Act.LOST,
        "",
    ),
]


@pytest.mark.parametrize(
    ("v", "act", "reason"),
    [case[1:] for case in DECISIONS],
    ids=[case[0] for case in DECISIONS],
)
def test_decide_keda(v: View, act: Act, reason: str) -> None:
    step = decide_keda(v)
    assert step.act is act
    assert reason in step.reason


def backend_for(backend: dict[str, Any]) -> Backend:
    """The backend a target with this config gets (built, not opened)."""
    config = parse_config({"targets": {"t": {"routes": [{}], "backend": backend}}})
    return make_backend("t", config.targets["t"].backend, ".", environ={}, kube_environ={})


def test_only_a_keda_mode_backend_hands_its_replicas_to_keda() -> None:
    process = backend_for({"kind": "process", "command": ["engine"]})
    static = backend_for({"kind": "static", "url": "http://127.0.0.1:1"})
    assert not keda_owns_replicas(process) and not keda_owns_replicas(static)
    assert target_concurrency(process) == 1.0


def test_target_concurrency_comes_from_the_kubernetes_backend() -> None:
    keda = backend_for(
        {
            "kind": "kubernetes",
            "namespace": "render",
            "deployment": "comfyui",
            "port": 8188,
            "mode": "keda",
            "target_concurrency": 4,
        }
    )
    assert keda_owns_replicas(keda)
    assert target_concurrency(keda) == 4.0
