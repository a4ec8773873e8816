"""A target's config: its routes, timeouts, limits, scaling and engine (docs/engines.md)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from backends.specs import (
    READY_PORT,
    Backend,
    EngineKind,
    EngineOptions,
    EngineSpec,
    Frozen,
    GradioWarmup,
    Park,
    ProcessSpec,
    Readiness,
)
from backends.units import MAX_COUNT, Duration, Size, integer, parse_duration, real
from router.config.windows import Window, parse_window

GRADIO_RELEASE_RATE = 2.0
"""``waiting.release_rate`` of ``engine: gradio`` (requests per second): each of Wan2GP's page
loads builds its whole UI config; two a second leave its launch check and its first jobs room."""


class Route(Frozen):
    """What sends a request to a target. The longest matching ``path_prefix`` wins across all
    targets; among equal prefixes, a route with hosts or headers beats one without."""

    hosts: tuple[str, ...] | None = None
    """Exact names or ``*.suffix`` wildcards, matched without the port; omitted: any host."""
    path_prefix: str = "/"
    """Matched on path segments: ``/comfy`` matches ``/comfy`` and ``/comfy/x``, not ``/comfyx``."""
    strip_prefix: bool = False
    """Remove the prefix before forwarding (an engine that serves its UI at ``/``)."""
    headers: Mapping[str, str] = Field(default_factory=dict)
    """All must match exactly (header names are case-insensitive)."""

    @field_validator("path_prefix")
    @classmethod
    def _prefix_is_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must start with '/', got {value!r}")
        if value.startswith("/.warmgate"):
            raise ValueError("/.warmgate/ is reserved for warmgate's own pages")
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts_are_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must list at least one host, or be omitted to match any host")
        for host in value:
            bare = host[2:] if host.startswith("*.") else host
            if not bare or "*" in bare or "/" in bare or " " in bare:
                raise ValueError(f"expected a host name or '*.suffix' wildcard, got {host!r}")
        return tuple(h.lower() for h in value)


class Timeouts(Frozen):
    connect: Duration = 5.0
    """Seconds to open a TCP connection to a ready upstream; loopback or LAN, so short."""
    response_headers: Duration = 300.0
    """Seconds from sending the request (its whole body) to the upstream's status line. Long:
    a render engine may answer only when the work is done."""
    upstream_idle: Duration = 4.0
    """Seconds an idle keep-alive connection to the upstream is kept for the next request
    (0: none is). Shorter than the upstream's own idle timeout (uvicorn, under Gradio and
    vLLM: 5 s), so that warmgate closes it first and no request is sent on a connection the
    upstream is closing."""


class Limits(Frozen):
    max_body: Size = 100 * 2**20
    """Largest request body in bytes; bigger -> 413. 100 MiB fits image and video uploads."""
    max_connections: Annotated[int, integer(0, MAX_COUNT)] = 0
    """Upstream connections per target (0: unlimited). Keep-alive pooled."""
    max_ws_message: Size = Field(default=64 * 2**20, ge=1)
    """Largest websocket message in bytes, either way (its frames assembled); bigger -> the
    websocket is closed with 1009 on both sides. 64 MiB holds a large preview image or a
    latent; without a bound one client could make warmgate assemble gigabytes in memory."""


class Waiting(Frozen):
    """What waits for a target that is not ready, besides held requests and the waiting page."""

    hold_websockets: bool | None = None
    """A websocket upgrade to a target that is not ready (cold, parked, starting) is accepted
    and held open silently, without waking the target; once a real request made it ready,
    warmgate connects the engine's websocket with the same path and query and bridges the two.
    A release or a park does not close it either: the tab's socket is held again until the
    next start. Held, it is no activity, never wakes, and counts in ``scaling.max_held``.
    Omitted: true for ``engine: comfyui`` (a tab retries its websocket and shows "Reconnecting"
    until reloaded), false for the others, whose pages do not depend on one socket."""

    release_rate: Annotated[float, real(0, 1e6)] | None = None
    """Requests held through a start (and waiting pages that continue) let through at most this
    many per second once the target is ready; a burst at "ready" no longer lands on an engine
    that has only just started. ``0``: all at once. Omitted: 2 for ``engine: gradio`` (a burst of
    page loads right after Wan2GP started made its launch check time out, and it exited), all
    at once for the others."""


def _idle_after(value: object) -> object:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return parse_duration(value)
    except ValueError as exc:
        if not isinstance(value, str):  # a number out of range: why, as for other durations
            raise ValueError(f"{exc} (or auto)") from None
        raise ValueError(f"expected a duration such as 30s, 5m, or auto, got {value!r}") from None


def _bounds(value: object) -> object:
    if isinstance(value, list | tuple) and len(value) == 2:
        return value
    raise ValueError(f"expected [lower, upper] such as [2m, 1h], got {value!r}")


def _one_or_more(value: object) -> object:
    return [value] if isinstance(value, str) else value  # one window needs no list


IdleAfter = Annotated[float | Literal["auto"], BeforeValidator(_idle_after)]
"""A duration, or ``auto``: learned from the target's gaps between bursts (docs/simulate.md)."""


class Scaling(Frozen):
    idle_after: IdleAfter = 1800.0
    """No activity this long -> scale to zero and release the GPU. 30 minutes: a person reading
    their render does not lose the warm model; an abandoned tab frees the card within the hour.
    ``auto``: learned from this target's own gaps between bursts of use, within
    ``idle_bounds`` (docs/simulate.md)."""
    idle_bounds: Annotated[tuple[Duration, Duration], BeforeValidator(_bounds)] = (120.0, 3600.0)
    """``[lower, upper]`` for ``idle_after: auto``: it never learns a value outside them, and
    holds the upper one until it has seen enough gaps. 2 minutes: less releases the card between
    two renders; 1 hour: more holds a card all afternoon for one more render."""
    keep_warm: Annotated[tuple[str, ...], BeforeValidator(_one_or_more)] = ()
    """Time windows (``"Mon-Fri 08:30-18:00 Europe/Berlin"``: days, local time span, IANA zone,
    UTC when omitted) during which the target is started ahead of use (a predicted cold start
    before the window opens) and never released for idleness; one window may be given as a
    string. None by default: a GPU is held only for
    work."""
    cold_start_timeout: Duration = 300.0
    """Longest a request is held for a cold start; heavy render images take ~2 minutes."""
    rollout_timeout: Duration = 600.0
    """Longest a rollout (a new pod template of a Kubernetes target) may take from pods running
    for it until every pod runs it, ready: past it, an event and
    ``warmgate_rollout_failures_total`` (a few image pulls and loads of a render image)."""
    max_held: Annotated[int, integer(1, MAX_COUNT)] = 1000
    """Requests held at once per target; beyond: 503 with Retry-After (shedding)."""
    stream_activity_window: Duration = 60.0
    """A websocket or SSE stream counts as activity if it carried a frame this recently."""
    wake_on: Literal["any", "navigation", "none"] = "any"
    """What wakes a cold target: any request that is not a websocket upgrade (``any``),
    only browser page loads and non-GET requests (``navigation``), or nothing (``none``)."""
    busy_poll: Duration = 2.0
    """How often a ready target's engine is asked whether it is busy (a render in its queue)."""
    failure_backoff: Duration = 10.0
    """First wait after a failed cold start; doubles per failure up to ``failure_backoff_max``."""
    failure_backoff_max: Duration = 300.0
    start_retries: Annotated[int, integer(0, 10)] = 1
    """Times a start whose workload exited before it was ever ready is started again at once,
    while requests are held for it or its waiting page is open (and within
    ``cold_start_timeout``), before it fails. 1: a Gradio app that dies in its own launch check
    on a loaded host (2 of 36 Wan2GP cold starts) gets a second try; a workload that always
    dies fails one start later. 0: never."""
    expected_cold_start: Duration | None = None
    """Seconds a cold start is expected to take before warmgate has seen one of this target:
    the waiting page's first ETA and what the API policy predicts (``max_wait`` against it).
    Omitted: ``policy.assumed_cold_start`` (30 s). Once starts were seen, they are learned from
    (and kept across restarts: docs/operations.md), and this is no longer used."""
    abandon_after: Duration = 120.0
    """A start nobody waits for any more (no held request, no request and no waiting page
    since this long) is stopped, so a pod left Pending on a busy cluster does not take a GPU
    hours later with nobody there. 2 minutes: longer than a page reload or a client's retry,
    shorter than a batch job's wait for the GPU. 0: never abandoned."""
    park_after: IdleAfter = 0.0
    """Idle this long -> parked: the engine drops its weights from the GPU, its process (or pod)
    stays, and the next request waits about a second for a reload instead of a cold start
    (docs/pools.md). 0 (the default): never parked for idleness; ``idle_after`` still stops it.
    ``auto``: learned from the same gaps as ``idle_after: auto``, priced with the wake instead
    of the cold start, within ``idle_bounds`` (docs/simulate.md)."""
    expected_wake: Duration | None = None
    """Seconds a wake from parked is expected to take before warmgate has seen one of this
    target (the waiting page's first ETA, the API policy's prediction, what ``park_after: auto``
    prices a wake at, and a wake's length in ``warmgate simulate`` where no wake was kept).
    Omitted: 2 s, about a reload of 8 GiB from host memory and a probe. Learned from the first
    wake on, and kept across restarts (``state_dir``, or the Deployment's annotation)."""

    @field_validator("idle_bounds")
    @classmethod
    def _bounds_ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        if value[0] > value[1]:
            raise ValueError(f"expected [lower, upper] with lower <= upper, got {list(value)}")
        if value[0] <= 0:
            raise ValueError(
                f"expected a lower bound above 0, got {list(value)}: at 0 a learned idle_after "
                "would release the target between two renders"
            )
        return value

    @field_validator("keep_warm")
    @classmethod
    def _windows(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            parse_window(text)
        return value

    @property
    def idle_auto(self) -> bool:
        """``idle_after: auto``: the value is learned (:mod:`router.scale.idle_policy`)."""
        return self.idle_after == "auto"

    @property
    def idle_seconds(self) -> float:
        """The fixed ``idle_after``; for ``auto``, the upper bound it falls back to."""
        return self.idle_bounds[1] if isinstance(self.idle_after, str) else self.idle_after

    @property
    def park_auto(self) -> bool:
        """``park_after: auto``: the value is learned (:mod:`router.scale.idle_policy`)."""
        return self.park_after == "auto"

    @property
    def park_seconds(self) -> float:
        """The fixed ``park_after`` (0: never parked for idleness); for ``auto``, the lower
        bound it falls back to."""
        return self.idle_bounds[0] if isinstance(self.park_after, str) else self.park_after

    @property
    def windows(self) -> tuple[Window, ...]:
        """``keep_warm``, parsed."""
        return tuple(parse_window(text) for text in self.keep_warm)


class Target(Frozen):
    engine: EngineKind = "http"
    """Protocol the workload speaks (http, comfyui, gradio, openai); it decides readiness
    probing, busy signals and which requests wake a cold target (docs/engines.md)."""
    warmup_workflow: str | None = None
    """comfyui only: an API-format workflow (JSON file, relative to the config file) queued at
    every cold start; the target counts as ready once it completed, so the checkpoint is in
    VRAM before the first user render. Omitted: ready when ``/system_stats`` answers."""
    warmup: GradioWarmup | None = None
    """gradio only: ``{api_name, data}``, one call through the app's API made at every cold start
    before the target counts as ready (an app that loads its model on first use). Omitted:
    ready when ``/config`` answers."""
    routes: tuple[Route, ...]
    backend: Backend
    timeouts: Timeouts = Timeouts()
    limits: Limits = Limits()
    readiness: Readiness = Readiness()
    scaling: Scaling = Scaling()
    waiting_page: Literal["auto", "off"] = "auto"
    """``auto``: a browser page load to a cold target gets the waiting page at once."""
    waiting: Waiting = Waiting()
    """What else waits while the target is not ready: ``hold_websockets``."""
    park: Park = "auto"
    """How the target is parked, after ``scaling.park_after`` or when its pool needs room
    (docs/pools.md): ``auto``: the engine's own action (comfyui ``POST /free``; openai vLLM's sleep
    mode, with ``engine_options.sleep_mode``; none for gradio and http, which are stopped
    instead); ``off``: never parked; or ``{request, wake, parked}``: the engine's requests."""
    engine_options: EngineOptions = EngineOptions()
    """Options of the engine kind (``sleep_mode`` for openai)."""
    pool: str | None = None
    """The GPU pool (``pools:``) this target takes turns on; omitted: it waits for no one."""
    priority: Annotated[int, integer(-(2**31), MAX_COUNT)] = 0
    """In its pool: among targets idle for the pool's ``yield_after``, the lowest priority is
    displaced first (then the longest idle). 0 by default: all equal."""

    @property
    def holds_websockets(self) -> bool:
        """``waiting.hold_websockets``, or the engine's default (comfyui: yes)."""
        hold = self.waiting.hold_websockets
        return self.engine == "comfyui" if hold is None else hold

    @property
    def release_rate(self) -> float | None:
        """``waiting.release_rate`` per second, or the engine's default (gradio: 2); ``None``:
        all at once."""
        rate = self.waiting.release_rate
        if rate is None:
            rate = GRADIO_RELEASE_RATE if self.engine == "gradio" else 0.0
        return rate or None

    @field_validator("routes")
    @classmethod
    def _has_routes(cls, value: tuple[Route, ...]) -> tuple[Route, ...]:
        if not value:
            raise ValueError("a target needs at least one route, e.g. [{path_prefix: /}]")
        return value

    @model_validator(mode="before")
    @classmethod
    def _gradio_root_path(cls, data: object) -> object:
        """A Gradio app behind one path prefix builds its file URLs from X-Forwarded-Host plus
        its root path, which only it knows: a ``process`` child gets ``GRADIO_ROOT_PATH`` set to
        the prefix unless its ``env`` names one (docs/engines.md)."""
        if not isinstance(data, Mapping) or data.get("engine") != "gradio":
            return data
        backend, routes = data.get("backend"), data.get("routes")
        if not isinstance(backend, Mapping) or backend.get("kind") != "process":
            return data
        env = backend.get("env") or {}
        if not isinstance(env, Mapping) or "GRADIO_ROOT_PATH" in env:
            return data
        prefixes = {
            str(route.get("path_prefix", "/")).rstrip("/")
            for route in routes or ()
            if isinstance(route, Mapping)
        }
        if len(prefixes) != 1 or prefixes == {""}:
            return data
        root = {"GRADIO_ROOT_PATH": prefixes.pop()}
        return {**data, "backend": {**backend, "env": {**env, **root}}}

    @model_validator(mode="after")
    def _ready_port_is_given(self) -> Target:
        """``readiness.port: "{ready_port}"`` probes a port that only a ``process`` target's
        command (or env) can be told."""
        if self.readiness.port != READY_PORT:
            return self
        backend = self.backend
        told = isinstance(backend, ProcessSpec) and any(
            READY_PORT in part for part in (*backend.command, *backend.env.values())
        )
        if not told:
            raise ValueError(
                'readiness.port "{ready_port}" needs a process backend whose command (or env) '
                "passes {ready_port} to the engine's readiness listener; for another backend "
                "give the port's number"
            )
        return self

    @field_validator("warmup_workflow")
    @classmethod
    def _workflow_for_comfyui(cls, value: str | None, info: ValidationInfo) -> str | None:
        engine = info.data.get("engine")
        if value is not None and engine not in (None, "comfyui"):
            raise ValueError(f"warmup_workflow is for engine: comfyui (this one is {engine})")
        return value

    @field_validator("warmup")
    @classmethod
    def _warmup_for_gradio(
        cls, value: GradioWarmup | None, info: ValidationInfo
    ) -> GradioWarmup | None:
        engine = info.data.get("engine")
        if value is not None and engine not in (None, "gradio"):
            raise ValueError(f"warmup is for engine: gradio (this one is {engine})")
        return value

    def engine_spec(self, base_dir: str) -> EngineSpec:
        """What :func:`backends.registry.make_engine` needs; files resolved against ``base_dir``."""
        workflow = self.warmup_workflow
        return EngineSpec(
            kind=self.engine,
            readiness=self.readiness,
            wake_on=self.scaling.wake_on,
            warmup_workflow=str(Path(base_dir, workflow).resolve()) if workflow else None,
            warmup=self.warmup,
            park=self.park,
            options=self.engine_options,
        )
