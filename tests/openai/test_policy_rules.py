"""The policy's table rule by rule: for each rule, a request it decides (no rule above it
holds), what it decides, and that its reason is the one the table names."""

from __future__ import annotations

from dataclasses import replace

import pytest

from router.openai.facts import Ask, Facts, Rules, Snapshot
from router.openai.policy import TABLE, Action, decide, rule_for
from router.scale.state import Phase
from tests.openai.test_policy import (
    COLD,
    COLD_FAST,
    NOW,
    PRIVATE,
    PUBLIC,
    READY,
    RULES,
    local,
    snap,
)

FAILED = local(Phase.FAILED, retry_at=NOW + 5)
PARKED = local(Phase.PARKED)._replace(wake=2.0)
PARKED_SLOW = local(Phase.PARKED)._replace(wake=20.0)
POOL = local(Phase.COLD)._replace(pool_wait="waiting for the GPU: wan2gp is rendering")
STUCK = local(Phase.STARTING)._replace(unschedulable="0/3 nodes are available")
FAILED_OVER = replace(PUBLIC, cloud_failed=True)

# (index in TABLE, its reason, ask, snapshot, action, reason decided, status, warm)
EXAMPLES: list[tuple[int, str, Ask, Snapshot, Action, str, int, str | None]] = [
    (0, "ready", PUBLIC, snap(READY), Action.LOCAL, "ready", 0, None),
    (1, "cloud_failed", FAILED_OVER, snap(READY), Action.LOCAL, "cloud_failed", 0, None),
    (2, "local_busy", PUBLIC, snap(local(load=5)), Action.CLOUD, "local_busy", 0, None),
    (3, "busy_<why>", PRIVATE, snap(local(load=5)), Action.LOCAL, "busy_private", 0, None),
    (
        4,
        "cloud_failed",
        replace(FAILED_OVER, waited=2.0),
        snap(COLD_FAST),
        Action.HOLD,
        "cloud_failed",
        0,
        None,
    ),
    (
        5,
        "starting",
        PUBLIC,
        snap(local(Phase.STARTING, since=NOW - 25)),
        Action.HOLD,
        "starting",
        0,
        None,
    ),
    (6, "parked_within_budget", PUBLIC, snap(PARKED), Action.HOLD, "parked_within_budget", 0, None),
    (7, "cold_within_budget", PUBLIC, snap(COLD_FAST), Action.HOLD, "cold_within_budget", 0, None),
    (8, "pool_busy", PUBLIC, snap(POOL), Action.CLOUD, "pool_busy", 0, None),
    (9, "local_unschedulable", PUBLIC, snap(STUCK), Action.CLOUD, "local_unschedulable", 0, None),
    (10, "local_unavailable", PUBLIC, snap(FAILED), Action.CLOUD, "local_unavailable", 0, None),
    (11, "cloud_only", PUBLIC, snap(), Action.CLOUD, "cloud_only", 0, None),
    (12, "local_parked", PUBLIC, snap(PARKED_SLOW), Action.CLOUD, "local_parked", 0, "vllm"),
    (13, "local_cold", PUBLIC, snap(COLD), Action.CLOUD, "local_cold", 0, "vllm"),
    (14, "<why>", PRIVATE, snap(POOL), Action.HOLD, "private", 0, None),
    (15, "local_unschedulable", PRIVATE, snap(STUCK), Action.HOLD, "local_unschedulable", 0, None),
    (
        16,
        "budget_exhausted",
        PUBLIC,
        snap(FAILED, left=0.0),
        Action.REJECT,
        "budget_exhausted",
        429,
        None,
    ),
    (17, "cloud_failed", FAILED_OVER, snap(FAILED), Action.REJECT, "cloud_failed", 502, None),
    (
        18,
        "local_unavailable",
        PUBLIC,
        snap(FAILED, cloud=None),
        Action.REJECT,
        "local_unavailable",
        503,
        None,
    ),
    (19, "<why>", PRIVATE, snap(), Action.REJECT, "private", 503, None),
    (
        20,
        "private_local_late",
        PRIVATE,
        snap(COLD),
        Action.REJECT,
        "private_local_late",
        503,
        "vllm",
    ),
    (
        21,
        "cloud_failed",
        replace(FAILED_OVER, waited=9.0),
        snap(COLD_FAST),
        Action.REJECT,
        "cloud_failed",
        502,
        "vllm",
    ),
    (22, "<why>", PUBLIC, snap(COLD, cloud=None), Action.HOLD, "local_only", 0, None),
    (22, "<why>", PUBLIC, snap(COLD, left=0.0), Action.HOLD, "budget_exhausted", 0, None),
]


@pytest.mark.parametrize(
    ("index", "named", "ask", "snapshot", "action", "reason", "status", "warm"),
    EXAMPLES,
    ids=[f"{e[0]}-{e[5]}" for e in EXAMPLES],
)
def test_rule(
    index: int,
    named: str,
    ask: Ask,
    snapshot: Snapshot,
    action: Action,
    reason: str,
    status: int,
    warm: str | None,
) -> None:
    rule = TABLE[index]
    assert rule.reason == named
    facts = Facts.of(ask, snapshot, RULES)
    assert rule.when(facts)
    assert not any(earlier.when(facts) for earlier in TABLE[:index])
    assert rule.reason_for(facts) == reason
    decision = rule.then(facts, reason)
    assert (decision.action, decision.reason, decision.status, decision.warm) == (
        action,
        reason,
        status,
        warm,
    )
    assert decision.detail
    assert rule_for(facts) is rule
    assert decide(ask, snapshot, RULES) == decision


def test_every_rule_has_an_example() -> None:
    assert {e[0] for e in EXAMPLES} == set(range(len(TABLE)))


def test_the_last_rule_always_holds() -> None:
    facts = Facts.of(Ask(private=False, max_wait=0.0), snap(cloud=None), Rules())
    assert TABLE[-1].when(facts)


def test_warm_on_cloud_off_warms_nothing() -> None:
    facts = Facts.of(PUBLIC, snap(COLD), Rules(warm_on_cloud=False))
    rule = rule_for(facts)
    assert rule.reason == "local_cold"
    assert rule.then(facts, rule.reason).warm is None
