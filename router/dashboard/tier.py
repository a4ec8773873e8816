"""The parked tier and the GPU pools in the operator's view (docs/pools.md): a target's
``parked`` and ``park_at``, and the ``pools`` section, as JSON-able values. Times are loop times
turned into wall-clock epoch seconds by ``wall``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from backends.base import parking
from router.http.finite_json import finite
from router.scale.state import Phase
from router.scale.targets import TargetRuntime

Json = dict[str, Any]
Wall = Callable[[float | None], float | None]


def parked(runtime: TargetRuntime, wall: Wall) -> Json | None:
    """``None`` for a target that is never parked (its engine has no park action)."""
    if parking(runtime.engine) is None:
        return None
    state, wakes = runtime.state, runtime.learned.wakes
    is_parked = state.phase is Phase.PARKED
    return {
        "parked": is_parked,
        "since": wall(state.since) if is_parked else None,
        "parking": state.parking,
        "waking": state.waking,
        "park_after": runtime.learned.windows().park_after or None,
        "wake_eta": finite(round(wakes.predicted(), 2)),
        "wakes_seen": len(wakes.history),
    }


def park_at(runtime: TargetRuntime, idle_since: float | None) -> float | None:
    """Loop time a ready, idle target is parked (``None``: it is not counting down)."""
    state, park_after = runtime.state, runtime.learned.windows().park_after
    if state.phase is not Phase.READY or idle_since is None or park_after <= 0:
        return None
    if runtime.activity.held or parking(runtime.engine) is None:
        return None
    return idle_since + park_after


def pools(runtimes: Mapping[str, TargetRuntime], wall: Wall) -> Json | None:
    """Each pool: its capacity, who holds its GPUs, who waits and for what; ``None`` without
    pools."""
    seats: dict[str, list[TargetRuntime]] = {}
    for runtime in runtimes.values():
        if runtime.pool is not None:
            seats.setdefault(runtime.pool.name, []).append(runtime)
    if not seats:
        return None
    out: Json = {}
    for name, members in seats.items():
        pool = members[0].pool
        assert pool is not None
        plan = pool.plan()
        out[name] = {
            "capacity": pool.capacity,
            "yield_after": pool.yield_after,
            "resident": [m.name for m in members if m.state.resident],
            "parked": [m.name for m in members if m.state.phase is Phase.PARKED],
            "waiting": {target: wait.reason for target, wait in plan.waiting.items()},
            "making_room": {
                victim: {"for": whom, "how": how} for victim, (whom, how) in plan.displace.items()
            },
            "members": {
                m.name: {"priority": m.spec.priority, "phase": m.state.phase.value} for m in members
            },
        }
    return out
