"""``pools:``: GPUs that several targets take turns on; and the cross-checks of pools and of the
parked tier against the targets (docs/pools.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated

from backends.specs import Frozen, no_auto_park
from backends.units import Duration, integer
from router.config.targets import Target

POOL_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")


class Pool(Frozen):
    """GPUs that several targets take turns on: at most ``capacity`` of them resident at once
    (starting, ready, draining, or waking from parked); a parked target does not count."""

    capacity: Annotated[int, integer(1, 1000)] = 1
    """Targets resident at once. 1: one card that one engine fills (a 5090 workstation)."""
    yield_after: Duration = 30.0
    """A resident target idle this long may be displaced (parked if it can be, else stopped)
    for another that must start or wake. 30 s: a person looking at their render keeps the card;
    the next person does not wait long for one who left."""


def pool_problems(
    pools: Mapping[str, Pool], targets: Mapping[str, Target]
) -> list[tuple[str, str]]:
    """Pool names, and targets in pools that do not exist, as (key path, problem)."""
    problems: list[tuple[str, str]] = []
    for name in pools:
        if not POOL_NAME.match(name):
            problems.append(
                (
                    f"pools.{name}",
                    "expected a pool name of lowercase letters, digits, '-', '_', '.'",
                )
            )
    for name, target in targets.items():
        if target.pool is not None and target.pool not in pools:
            known = sorted(pools) or "none configured"
            problems.append(
                (f"targets.{name}.pool", f"no pool named {target.pool!r} (pools: {known})")
            )
    return problems


def park_problems(targets: Mapping[str, Target]) -> list[tuple[str, str]]:
    """``scaling.park_after`` with no way to park, or not before ``idle_after``; engine options
    for another engine, as (key path, problem)."""
    problems: list[tuple[str, str]] = []
    for name, target in targets.items():
        at = f"targets.{name}"
        if target.engine_options.sleep_mode and target.engine != "openai":
            problems.append(
                (f"{at}.engine_options.sleep_mode", f"is for engine: openai (this one is "
                 f"{target.engine})")
            )  # fmt: skip
        scaling = target.scaling
        park_after = scaling.park_seconds
        if park_after <= 0 and not scaling.park_auto:
            continue
        if target.park == "off":
            problems.append(
                (f"{at}.scaling.park_after", "park: off never parks; remove park_after or park")
            )
        elif target.park == "auto":
            missing = no_auto_park(target.engine, target.engine_options)
            if missing is not None:
                problems.append((f"{at}.scaling.park_after", missing))
        if scaling.park_auto:  # learned within idle_bounds, before the release
            if not scaling.idle_auto and scaling.idle_seconds <= scaling.idle_bounds[0]:
                problems.append(
                    (
                        f"{at}.scaling.park_after",
                        f"auto parks within idle_bounds, from {scaling.idle_bounds[0]:g}s: "
                        f"no time is left before idle_after ({scaling.idle_seconds:g}s)",
                    )
                )
            continue
        idle_after = scaling.idle_bounds[0] if scaling.idle_auto else scaling.idle_seconds
        if park_after >= idle_after:
            problems.append(
                (
                    f"{at}.scaling.park_after",
                    f"must be shorter than idle_after ({idle_after:g}s): a target idle for "
                    "idle_after is stopped, parked or not",
                )
            )
    return problems
