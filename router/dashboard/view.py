"""The operator's view as one JSON-able snapshot: what ``GET /status`` answers, what ``GET
/events`` streams, what the page and ``warmgate status`` are drawn from.

Times are wall-clock epoch seconds (``now`` says the server's), durations are seconds. A field
that does not exist yet for a target (its stage, the parked tier, a pool) is ``null``: the page
and ``warmgate status`` show "-" and pick it up once it is there.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.cluster.replicas import Replicas
from router.config import Config, Placement
from router.dashboard import day, tier
from router.dashboard.events import EventBus
from router.dashboard.today import Today
from router.http.finite_json import finite
from router.openai.api import OpenAIApi
from router.scale.state import Phase
from router.scale.targets import TargetRuntime

Json = dict[str, Any]


@dataclass
class Sources:
    """What the view is read from (set once, when the admin app is built)."""

    config: Config
    runtimes: Mapping[str, TargetRuntime]
    today: Today
    bus: EventBus
    api: OpenAIApi | None = None
    replicas: Replicas | None = None
    actions: bool = False
    """Whether the actions are allowed (``admin.token_file`` is configured)."""

    def loop_now(self) -> float:
        return self.bus.loop.time()


def snapshot(src: Sources, events: bool = True) -> Json:
    """The whole view; ``events=False`` leaves the event list out (the stream sends it apart)."""
    out: Json = {"now": round(time.time(), 3), **state(src)}
    if events:
        out["events"] = [event.to_json() for event in reversed(src.bus.events)]
    return out


def state(src: Sources) -> Json:
    """Everything but the time of reading and the events: equal while nothing changed."""
    gpu = src.today.gpu_seconds_today()
    return {
        "replica": src.replicas.identity if src.replicas is not None else None,
        "actions": src.actions,
        "targets": {
            name: target(src, runtime, gpu.get(name, {})) for name, runtime in src.runtimes.items()
        },
        "pools": tier.pools(src.runtimes, lambda t: _wall(src, t)),
        "api": api(src, src.api) if src.api is not None else None,
        "replicas": replicas(src, src.replicas) if src.replicas is not None else None,
    }


def _wall(src: Sources, loop_time: float | None) -> float | None:
    if loop_time is None or loop_time in (float("inf"), float("-inf")):
        return None
    return round(src.today.wall(loop_time), 1)


def target(src: Sources, runtime: TargetRuntime, gpu: Mapping[str, float]) -> Json:
    now = src.loop_now()
    state, activity, spec = runtime.state, runtime.activity, runtime.spec
    scaling = spec.scaling
    window = scaling.stream_activity_window
    idle_since = activity.idle_since(window)
    if src.replicas is not None:  # idle only when every replica is
        idle_since = src.replicas.combined(runtime.name).idle_since
    always_on = runtime.backend.always_on
    release_at = None  # counting down while ready and idle: the same release as idleness
    if state.phase in (Phase.READY, Phase.PARKED) and not always_on and idle_since is not None:
        release_at = (
            idle_since + runtime.learned.windows().idle_after if activity.held == 0 else None
        )
    eta = runtime.learned.predicted_cold_start()
    failure = src.today.last_failure(runtime.name)
    wall_now = runtime.timeline.wall(now)
    return {
        "phase": state.phase.value,
        "stage": state.stage if state.phase is Phase.STARTING else None,
        "stage_message": state.stage_message or None,
        "progress": state.progress,
        "parked": tier.parked(runtime, lambda t: _wall(src, t)),
        "waiting_for": state.waiting_for or None,
        "since": _wall(src, state.since),
        "reason": state.reason,
        "endpoints": list(state.endpoints),
        "held": activity.held,
        "in_flight": activity.in_flight,
        "activity": {
            "requests": activity.in_flight,
            "streams": len(activity.streams),
            "streams_active": activity.last_frame + window > now,
            "engine_busy": activity.busy_until > now,
            "wanted": activity.wanted_until > now,
        },
        "idle_since": None if idle_since is None else _wall(src, idle_since),
        "release_at": _wall(src, release_at),
        "park_at": _wall(src, tier.park_at(runtime, idle_since)),
        "retry_at": _wall(src, state.retry_at) if state.phase is Phase.FAILED else None,
        "failures": state.failures,
        "lifecycle": lifecycle_of(runtime),
        "always_on": always_on,
        "backend": spec.backend.kind,
        "engine": spec.engine,
        "idle_after": runtime.learned.windows().idle_after,
        "idle": runtime.learned.describe_idle(),
        "eta": None if always_on else finite(round(eta, 1)),
        "cold_starts_today": [s.to_json() for s in src.today.starts_today(runtime.name)],
        "gpu_seconds_today": {
            "busy": gpu.get("busy", 0.0),
            "idle": gpu.get("idle", 0.0),
            "parked": gpu.get("parked"),
        },
        "last_failure": None
        if failure is None
        else {"at": round(failure[0], 1), "reason": failure[1]},
        "timeline": day.timeline(runtime, wall_now),
        "gpu_hours_today": day.gpu_hours_today(runtime, wall_now),
        **_waits(day.waits_today(runtime, wall_now)),
    }


def _waits(by_kind: Json) -> Json:
    """``waits_today`` (every wait's seconds, as before) and ``waits_today_by_kind``."""
    every = sorted(w for waits in by_kind.values() for w in waits)
    return {"waits_today": every, "waits_today_by_kind": by_kind}


def lifecycle_of(runtime: TargetRuntime) -> Json:
    """Whether the target's loop runs (an always-on target needs none), and its last failure."""
    supervisor = runtime.supervisor
    error = supervisor.last_error
    return {
        "running": supervisor.running or runtime.backend.always_on,
        "last_error": None if error is None else error.to_json(),
    }


def _placement(spec: Placement) -> str:
    if spec.target is not None:
        return f"local {spec.target}" + (f" ({spec.model})" if spec.model else "")
    return f"cloud {spec.cloud}/{spec.model}"


def _where(placement: str, placements: Sequence[Placement]) -> str:
    """local, cloud or none (refused) for a decision's placement label."""
    for p in placements:
        if placement == p.target:
            return "local"
        if placement in (p.cloud, f"{p.cloud}/{p.model}"):
            return "cloud"
    return "none"


def api(src: Sources, api: OpenAIApi) -> Json:
    budget = api.budget
    decisions = src.today.decisions_last_hour(src.loop_now())
    return {
        "budget": {
            "day": budget.day.isoformat(),
            "limit": budget.limit,
            "spent": round(budget.spent, 4),
            "reserved": round(budget.reserved, 4),
            "open_reservations": budget.outstanding,
            "left": round(budget.left(), 4),
        },
        "spend_today_by_cloud": src.today.cloud_spend_today(),
        "spend_today_by_model": budget.spend_by_model(),
        "spend_line_by_model": {
            model: [[round(t, 1), round(usd, 6)] for t, usd in line]
            for model, line in budget.by_model.items()
        },
        "models": {
            name: {
                "kind": spec.kind,
                "placements": [_placement(p) for p in spec.placements],
                "clouds": sorted({p.cloud for p in spec.placements if p.cloud is not None}),
                "decisions_last_hour": [
                    {**d, "where": _where(str(d["placement"]), spec.placements)}
                    for d in decisions.get(name, [])
                ],
                "ttft": api.first_tokens.describe(name),
            }
            for name, spec in src.config.models.items()
        },
    }


def replicas(src: Sources, replicas: Replicas) -> Json:
    described = replicas.describe()
    now = time.time()
    peers = []
    for peer in described["peers"]:
        ago = peer.get("heard_seconds_ago")
        peers.append(
            {
                "name": peer["name"],
                "url": peer["url"],
                "reachable": peer["reachable"],
                "listed": peer["listed"],
                "heard_at": None if ago is None else round(now - ago, 1),
                "error": peer["error"],
            }
        )
    return {
        "self": described["replica"],
        "leading": described["leader"],
        "problems": described["problems"],
        "peers": peers,
    }
