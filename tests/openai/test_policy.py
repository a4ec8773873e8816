"""The placement decision as a table of cases over snapshots: no I/O, no event loop."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from router.openai.facts import Ask, CloudOption, LocalOption, Rules, Snapshot
from router.openai.policy import Action, decide
from router.scale.state import Phase

NOW = 1000.0


def local(
    phase: Phase = Phase.READY,
    *,
    load: int = 0,
    cold_start: float = 30.0,
    since: float = NOW,
    retry_at: float = 0.0,
    held: int = 0,
    may_start: bool = True,
    target: str = "vllm",
    position: int = 0,
) -> LocalOption:
    return LocalOption(
        position=position,
        target=target,
        phase=phase,
        since=since,
        servable=phase is Phase.READY,
        load=load,
        held=held,
        max_held=10,
        cold_start=cold_start,
        retry_at=retry_at,
        may_start=may_start,
    )


CLOUD = CloudOption(position=1, cloud="managed", model="frontier", available=True, cost=0.01)
READY = local()
COLD = local(Phase.COLD)
COLD_FAST = local(Phase.COLD, cold_start=5.0)


def snap(*locals_: LocalOption, cloud: CloudOption | None = CLOUD, left: float = 25.0) -> Snapshot:
    return Snapshot(tuple(locals_), (cloud,) if cloud else (), budget_left=left, now=NOW)


PUBLIC = Ask(private=False, max_wait=10.0)
PRIVATE = Ask(private=True, max_wait=10.0)
RULES = Rules(overflow_queue_depth=4, warm_on_cloud=True)

# (name, ask, snapshot, rules, action, placement, reason, warm, status)
CASES = [
    ("ready local", PUBLIC, snap(READY), RULES, Action.LOCAL, "vllm", "ready", None, 0),
    (
        "ready at the depth",
        PUBLIC,
        snap(local(load=4)),
        RULES,
        Action.LOCAL,
        "vllm",
        "ready",
        None,
        0,
    ),
    (
        "saturated -> cloud",
        PUBLIC,
        snap(local(load=5)),
        RULES,
        Action.CLOUD,
        "managed/frontier",
        "local_busy",
        None,
        0,
    ),
    (
        "saturated, private -> local anyway",
        PRIVATE,
        snap(local(load=5)),
        RULES,
        Action.LOCAL,
        "vllm",
        "busy_private",
        None,
        0,
    ),
    (
        "saturated, budget spent -> local",
        PUBLIC,
        snap(local(load=5), left=0.0),
        RULES,
        Action.LOCAL,
        "vllm",
        "busy_budget_exhausted",
        None,
        0,
    ),
    (
        "least loaded of two",
        PUBLIC,
        snap(local(load=3), local(load=1, target="b", position=2)),
        RULES,
        Action.LOCAL,
        "b",
        "ready",
        None,
        0,
    ),
    (
        "cold within budget -> hold",
        PUBLIC,
        snap(COLD_FAST),
        RULES,
        Action.HOLD,
        "vllm",
        "cold_within_budget",
        None,
        0,
    ),
    (
        "cold over budget -> cloud, warm",
        PUBLIC,
        snap(COLD),
        RULES,
        Action.CLOUD,
        "managed/frontier",
        "local_cold",
        "vllm",
        0,
    ),
    (
        "cold over budget, no warm_on_cloud",
        PUBLIC,
        snap(COLD),
        Rules(4, False),
        Action.CLOUD,
        "managed/frontier",
        "local_cold",
        None,
        0,
    ),
    (
        "starting, nearly ready -> hold",
        PUBLIC,
        snap(local(Phase.STARTING, since=NOW - 25)),
        RULES,
        Action.HOLD,
        "vllm",
        "starting",
        None,
        0,
    ),
    (
        "starting, far -> cloud, no second warm",
        PUBLIC,
        snap(local(Phase.STARTING, since=NOW - 1)),
        RULES,
        Action.CLOUD,
        "managed/frontier",
        "local_cold",
        None,
        0,
    ),
    (
        "overdue start counts as imminent",
        PUBLIC,
        snap(local(Phase.STARTING, since=NOW - 100)),
        RULES,
        Action.HOLD,
        "vllm",
        "starting",
        None,
        0,
    ),
    (
        "header budget zero -> cloud",
        replace(PUBLIC, max_wait=0.0),
        snap(COLD_FAST),
        RULES,
        Action.CLOUD,
        "managed/frontier",
        "local_cold",
        "vllm",
        0,
    ),
    (
        "private, cold within budget -> hold",
        PRIVATE,
        snap(COLD_FAST),
        RULES,
        Action.HOLD,
        "vllm",
        "cold_within_budget",
        None,
        0,
    ),
    (
        "private, cold over budget -> 503, warm",
        PRIVATE,
        snap(COLD),
        RULES,
        Action.REJECT,
        "none",
        "private_local_late",
        "vllm",
        503,
    ),
    (
        "private, tiny budget, huge money -> 503",
        replace(PRIVATE, max_wait=0.001),
        snap(COLD_FAST, left=1e9),
        RULES,
        Action.REJECT,
        "none",
        "private_local_late",
        "vllm",
        503,
    ),
    (
        "private, cloud-only model -> 503",
        PRIVATE,
        snap(),
        RULES,
        Action.REJECT,
        "none",
        "private",
        None,
        503,
    ),
    (
        "cloud-only -> cloud",
        PUBLIC,
        snap(),
        RULES,
        Action.CLOUD,
        "managed/frontier",
        "cloud_only",
        None,
        0,
    ),
    (
        "cloud-only, budget spent -> 429",
        PUBLIC,
        snap(left=0.001),
        RULES,
        Action.REJECT,
        "none",
        "budget_exhausted",
        None,
        429,
    ),
    (
        "cloud-only, cloud key missing -> 503",
        PUBLIC,
        snap(cloud=CLOUD._replace(available=False)),
        RULES,
        Action.REJECT,
        "none",
        "cloud_unavailable",
        None,
        503,
    ),
    (
        "budget spent, local cold -> hold",
        PUBLIC,
        snap(COLD, left=0.0),
        RULES,
        Action.HOLD,
        "vllm",
        "budget_exhausted",
        None,
        0,
    ),
    (
        "budget spent, local failed -> 429",
        PUBLIC,
        snap(local(Phase.FAILED, retry_at=NOW + 60), left=0.0),
        RULES,
        Action.REJECT,
        "none",
        "budget_exhausted",
        None,
        429,
    ),
    (
        "cost exactly what is left -> cloud",
        PUBLIC,
        snap(COLD, left=0.01),
        RULES,
        Action.CLOUD,
        "managed/frontier",
        "local_cold",
        "vllm",
        0,
    ),
    (
        "local-only, cold over budget -> hold",
        PUBLIC,
        snap(COLD, cloud=None),
        RULES,
        Action.HOLD,
        "vllm",
        "local_only",
        None,
        0,
    ),
    (
        "local-only, private, cold -> hold",
        PRIVATE,
        snap(COLD, cloud=None),
        RULES,
        Action.HOLD,
        "vllm",
        "local_only",
        None,
        0,
    ),
    (
        "local-only, failed in backoff -> 503",
        PUBLIC,
        snap(local(Phase.FAILED, retry_at=NOW + 5), cloud=None),
        RULES,
        Action.REJECT,
        "none",
        "local_unavailable",
        None,
        503,
    ),
    (
        "failed in backoff -> cloud, no warm",
        PUBLIC,
        snap(local(Phase.FAILED, retry_at=NOW + 5)),
        RULES,
        Action.CLOUD,
        "managed/frontier",
        "local_unavailable",
        None,
        0,
    ),
    (
        "failed, backoff over -> treated as cold",
        PUBLIC,
        snap(local(Phase.FAILED, retry_at=NOW - 1, cold_start=2.0)),
        RULES,
        Action.HOLD,
        "vllm",
        "cold_within_budget",
        None,
        0,
    ),
    (
        "hold queue full -> cloud",
        PUBLIC,
        snap(local(Phase.STARTING, held=10)),
        RULES,
        Action.CLOUD,
        "managed/frontier",
        "local_unavailable",
        None,
        0,
    ),
    (
        "engine would not wake -> cloud",
        PUBLIC,
        snap(local(Phase.COLD, may_start=False)),
        RULES,
        Action.CLOUD,
        "managed/frontier",
        "local_unavailable",
        None,
        0,
    ),
    (
        "cloud failed, local ready -> local",
        replace(PUBLIC, cloud_failed=True),
        snap(local(load=9)),
        RULES,
        Action.LOCAL,
        "vllm",
        "busy_cloud_failed",
        None,
        0,
    ),
    (
        "cloud failed, local soon enough -> hold",
        replace(PUBLIC, cloud_failed=True, waited=2.0),
        snap(COLD_FAST),
        RULES,
        Action.HOLD,
        "vllm",
        "cloud_failed",
        None,
        0,
    ),
    (
        "cloud failed, wait used up -> 502",
        replace(PUBLIC, cloud_failed=True, waited=9.0),
        snap(COLD_FAST),
        RULES,
        Action.REJECT,
        "none",
        "cloud_failed",
        "vllm",
        502,
    ),
]


@pytest.mark.parametrize(
    ("ask", "snapshot", "rules", "action", "placement", "reason", "warm", "status"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_decision_table(
    ask: Ask,
    snapshot: Snapshot,
    rules: Rules,
    action: Action,
    placement: str,
    reason: str,
    warm: str | None,
    status: int,
) -> None:
    decision = decide(ask, snapshot, rules)
    assert (decision.action, decision.placement, decision.reason) == (action, placement, reason)
    assert decision.warm == warm
    assert decision.status == status
    depth = f"; queue_depth={decision.queue_depth}" if reason == "local_busy" else ""
    assert decision.header == f"{placement}; reason={reason}{depth}"
    assert decision.detail


@pytest.mark.parametrize(("max_wait", "left"), [(0.0, 1e12), (1e-6, 1e12), (math.inf, 0.0)])
@pytest.mark.parametrize(
    "locals_",
    [(), (COLD,), (READY,), (local(load=100),), (local(Phase.FAILED, retry_at=NOW + 9),)],
)
def test_private_work_never_goes_to_the_cloud(
    max_wait: float, left: float, locals_: tuple[LocalOption, ...]
) -> None:
    for cloud_failed in (False, True):
        ask = Ask(private=True, max_wait=max_wait, cloud_failed=cloud_failed)
        decision = decide(ask, snap(*locals_, left=left), RULES)
        assert decision.action is not Action.CLOUD
        assert decision.cloud is None


def test_ready_in_follows_the_phase() -> None:
    assert READY.ready_in(NOW) == 0.0
    assert COLD.ready_in(NOW) == 30.0
    assert local(Phase.STARTING, since=NOW - 10).ready_in(NOW) == 20.0
    assert local(Phase.STARTING, since=NOW - 40).ready_in(NOW) == 0.0
    assert math.isinf(local(Phase.FAILED, retry_at=NOW + 1).ready_in(NOW))
    assert local(Phase.DRAINING).ready_in(NOW) == 30.0  # stop issued: a fresh start
