"""The narrow interfaces between the router and what runs a target.

A **backend** runs and scales one target's workload (a local process, a Kubernetes Deployment, an
always-on URL) and reports what it observes. An **engine** knows the protocol the workload speaks:
whether it is ready (weights resident, not just the port open), whether it is still busy, and which
requests may wake it. The router knows nothing else about either.

Beside these: what keeps state across restarts (:class:`backends.documents.StateStore`), the
other warmgate replicas (:mod:`backends.membership`), a managed cloud (:mod:`backends.cloud_api`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args, runtime_checkable

from backends.outside import number, one_line


@dataclass(frozen=True, slots=True)
class Rollout:
    """A workload's declared version against what runs (a Kubernetes Deployment's pod template
    against its pods): what warmgate reports of a rollout it never makes."""

    declared: str
    """The image(s) the pod template names now."""
    running: str
    """The image(s) of the pods ready now (empty: none ready)."""
    updated: int
    """Pods of the declared template (``status.updatedReplicas``)."""
    ready: int
    """Ready pods of the declared template that serve (all of them once converged)."""
    replicas: int
    """Pods asked for (0: scaled to zero, verified at the next cold start)."""
    settled: bool
    """The cluster has seen the declared template (``observedGeneration``) and every pod asked
    for runs it, ready."""

    def __post_init__(self) -> None:  # image names as the cluster says them: one bounded line
        object.__setattr__(self, "declared", one_line(self.declared))
        object.__setattr__(self, "running", one_line(self.running))


@dataclass(frozen=True, slots=True)
class Observation:
    """What a backend sees of its workload right now. Replaced whole on every change."""

    running: bool = False
    """Something is running or asked to run (a live child process, replicas > 0)."""
    endpoints: tuple[str, ...] = ()
    """Base URLs (``http://127.0.0.1:41234``) that are up and may be probed or served."""
    failure: str | None = None
    """Why the last start failed or the workload died; ``None`` while healthy."""
    crashed: bool = False
    """The workload died without being asked to stop."""
    degraded: str | None = None
    """The backend cannot see or act right now (API server unreachable); serving may go on."""
    stage: Stage | None = None
    """Where a start is (:data:`STAGES`); ``None`` when the backend cannot tell, or nothing
    starts."""
    stage_message: str = ""
    """The stage in the cluster's own words (the scheduler's ``0/5 nodes are available: ...``)."""
    progress: float | None = None
    """The engine's own load progress (0..1) where the backend sees it; ``None``: unknown."""
    failure_reason: str | None = None
    """With ``failure``: the short cause of a start that can never succeed as it is
    (``ErrImagePull``, ``CrashLoopBackOff``): it fails at once, not at ``cold_start_timeout``."""
    rollout: Rollout | None = None
    """The declared version against what runs, where the backend can tell (Kubernetes)."""
    last_error: str | None = None
    """With ``crashed``: the exception the workload's own output ended with (a child's last
    traceback line on its stderr), what requests held for its start are told; ``None`` where it
    printed none."""
    probe_only: tuple[str, ...] = ()
    """Base URLs of workloads that run but are not ready (a pod whose readiness probe fails):
    while a start waits, the engine's readiness is asked there for its own words (a failed
    load, its progress), as the kubelet asks it. Never served: only ``endpoints`` are."""

    def __post_init__(self) -> None:
        # The door from a backend to the router: the words of a pod, a child or an API server
        # travel on as one bounded line, a progress only when it is one.
        for name in ("failure", "degraded", "failure_reason", "last_error"):
            text = getattr(self, name)
            if text is not None:
                object.__setattr__(self, name, one_line(text))
        if self.stage_message:
            object.__setattr__(self, "stage_message", one_line(self.stage_message))
        if self.progress is not None:
            object.__setattr__(self, "progress", number(self.progress, 0.0, 1.0))


Stage = Literal["scheduling", "unschedulable", "preempting", "pulling", "starting", "loading"]
"""Where a start is: waiting for the scheduler's decision; no node can take it now (every GPU
busy); lower-priority pods are evicted for it; its image is pulled; its container is created
and not running yet; running, its model loading (readiness not passing yet)."""
STAGES: tuple[Stage, ...] = get_args(Stage)
"""The stages, in the order a start goes through them."""


ObservationListener = Callable[[Observation], None]


class BackendError(Exception):
    """A backend that cannot do what its config asks, in words for the operator: refused at
    start (an RBAC rule missing, a second owner of the replica count) or a scale action the
    cluster forbids. Library errors are translated into this at the backend's boundary."""


class Backend(Protocol):
    """Runs and scales one target. Every method is idempotent and safe to call in any phase.

    A backend whose replicas an autoscaler outside warmgate may own offers :class:`Autoscaled`
    as well (asked through :func:`outside_autoscaler`)."""

    @property
    def always_on(self) -> bool:
        """True when there is nothing to scale (``static``): the target is ready from the start."""
        ...

    def observe(self) -> Observation:
        """The latest observation; never blocks."""
        ...

    async def open(self, listener: ObservationListener) -> None:
        """Start watching; ``listener`` is called (synchronously) with each new observation."""
        ...

    async def scale_up(self) -> None:
        """Ask for the workload to run. Returns once asked, not once ready."""
        ...

    async def scale_down(self, deadline: float | None = None) -> None:
        """Stop the workload and release its GPU. Returns once it is stopped (or, for a shared
        workload, once the stop is stored). ``deadline``: loop time after which a stop that
        could not be made yet is given up rather than retried (other warmgate replicas serve
        the workload again from then on)."""
        ...

    async def close(self) -> None:
        """Stop watching; stop what this process started itself (never a shared Deployment)."""
        ...


# -- replicas owned outside warmgate --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutsideAutoscaler:
    """An autoscaler outside warmgate owns the workload's replica count (KEDA, with warmgate as
    its external-push scaler: docs/keda.md). Warmgate never scales such a workload: it tells the
    autoscaler whether the target is wanted, and waits for replicas to come and go."""

    target_concurrency: float = 1.0
    """Requests (in flight + held) per replica that the autoscaler aims for."""


@runtime_checkable
class Autoscaled(Protocol):
    """What a :class:`Backend` whose replicas may be owned outside warmgate offers besides the
    protocol (the ``kubernetes`` backend, in ``mode: keda``). Optional: a backend without it is
    scaled by warmgate itself. Ask through :func:`outside_autoscaler`."""

    @property
    def outside_autoscaler(self) -> OutsideAutoscaler | None:
        """The autoscaler that owns the replicas; ``None`` while warmgate scales them."""
        ...


def outside_autoscaler(backend: Backend) -> OutsideAutoscaler | None:
    """Who owns ``backend``'s replicas when it is not warmgate; ``None`` for every backend that
    warmgate scales through ``scale_up``/``scale_down``."""
    return backend.outside_autoscaler if isinstance(backend, Autoscaled) else None


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What an engine may look at to decide whether a request wakes a cold target."""

    method: str
    path: str
    is_websocket: bool
    is_navigation: bool
    headers: dict[str, str] = field(default_factory=dict)


StreamActivity = Literal["open", "frames", "none", "jobs"]
"""How a long-lived stream counts: ``open``: activity for its whole life, like a request in
flight (a streamed completion); ``frames``: activity only while it carries frames (the generic
default); ``none``: never (a Gradio heartbeat, a ComfyUI tab's status socket); ``jobs``: an
event stream of JSON messages in Gradio's queue protocol (``{"msg", "event_id"}``), activity
while a job it carries is unfinished: from the first message naming its event id until its
``process_completed`` (``close_stream`` ends them all; heartbeats are nothing). A websocket
said to be ``jobs`` counts by its frames."""


@runtime_checkable
class ChoosesReadyPort(Protocol):
    """What a :class:`Backend` that picks a port for its workload's readiness listener offers
    (``process``, with ``{ready_port}`` in its command): where readiness is probed."""

    def readiness_url(self, base_url: str) -> str | None:
        """The base URL of the readiness listener of the workload serving at ``base_url``;
        ``None`` when it has none (or ``base_url`` is not its own)."""
        ...


class StartFailed(Exception):
    """The engine says its start failed and will not succeed as it is: its readiness answer says
    ``{"stage": "failed", "error": ...}`` (a launcher whose model could not load), or its
    warm-up failed. Raised from :meth:`Engine.probe_ready`; ``str()`` is the reason in the
    engine's own words, for the waiting page and the held requests: one bounded line."""

    def __init__(self, reason: object) -> None:
        super().__init__(one_line(reason))


@runtime_checkable
class CountsRefusals(Protocol):
    """An engine that tells when a number it answered was no answer (out of its bounds): the
    router counts it (a backend cannot reach the router's metrics). Optional."""

    on_refused: Callable[[str], None]
    """Called with the field's name (one the engine's code gives, never outside text)."""


class Engine(Protocol):
    """The protocol a target's workload speaks."""

    async def probe_ready(self, base_url: str) -> bool:
        """True once the engine reports itself able to serve (model resident); raises
        :class:`StartFailed` when it says it never will."""
        ...

    async def busy(self, base_url: str) -> bool:
        """True while the engine works with no HTTP traffic (a render in its own queue)."""
        ...

    def may_start(self, facts: RequestFacts) -> bool:
        """Whether this request may start a cold target."""
        ...

    def stream_activity(self, path: str) -> StreamActivity:
        """How a long-lived stream (SSE or websocket) at this upstream path counts as activity."""
        ...

    async def close(self) -> None: ...


# -- the parked tier ------------------------------------------------------------------------------


class ParkError(Exception):
    """A park or wake the engine refused, or did not answer in time; in words for the log.
    Raised at the engine's boundary (library errors translated); the target is then stopped."""


@runtime_checkable
class Parkable(Protocol):
    """What an :class:`Engine` that can be parked offers besides the protocol: its weights leave
    the GPU while its process (or pod) stays, and come back in about a second instead of a cold
    start (docs/pools.md). Optional; ask through :func:`parking`."""

    @property
    def parks(self) -> bool:
        """Whether this engine has a park action (its own with ``park: auto``, or the config's
        requests); ``False``: it is never parked, only stopped."""
        ...

    async def park(self, base_url: str) -> None:
        """Make the engine at ``base_url`` drop its weights from the GPU. Returns once it did
        (or once it was asked, where the engine cannot tell); raises :class:`ParkError`."""
        ...

    async def wake(self, base_url: str) -> None:
        """Ask a parked engine to load its weights again (nothing, for an engine that loads on
        its next request). Readiness is probed afterwards; raises :class:`ParkError`."""
        ...

    async def is_parked(self, base_url: str) -> bool | None:
        """Whether the engine says it is parked; ``None`` when it cannot tell (or did not
        answer)."""
        ...


@runtime_checkable
class ReportsProgress(Protocol):
    """What an :class:`Engine` whose readiness answer carries its load progress offers (a
    ``/readyz`` 503 with ``{"progress": 0.4}``); ask through :func:`load_progress`."""

    def load_progress(self, base_url: str) -> float | None:
        """The progress (0..1) the last readiness probe of ``base_url`` read; ``None``: none."""
        ...


def load_progress(engine: Engine, base_url: str) -> float | None:
    """The engine's load progress at ``base_url`` as last probed, where it reports one."""
    return engine.load_progress(base_url) if isinstance(engine, ReportsProgress) else None


@runtime_checkable
class ReportsStageMessage(Protocol):
    """What an :class:`Engine` whose readiness answer says in words where its start is offers
    (a ``/readyz`` 503 with ``{"message": "loading wan2.1_t2v.safetensors"}``, as the Wan2GP
    launcher's); ask through :func:`load_message`."""

    def load_message(self, base_url: str) -> str:
        """The words (one bounded line) the last readiness probe of ``base_url`` read; ``""``:
        none."""
        ...


def load_message(engine: Engine, base_url: str) -> str:
    """The engine's own words on its start at ``base_url`` as last probed, where it says any."""
    return engine.load_message(base_url) if isinstance(engine, ReportsStageMessage) else ""


@runtime_checkable
class NamesWebsockets(Protocol):
    """What an :class:`Engine` that names each websocket client offers (ComfyUI: the
    ``clientId`` its messages for a tab are addressed to); ask through :func:`websocket_again`."""

    def websocket_again(self, path: str, first_message: str) -> str:
        """The path (with its query) to connect a client's websocket to this engine again at:
        ``path``, where it was opened, asking for the name the engine gave it (read from the
        first text message the engine sent it)."""
        ...


def websocket_again(engine: Engine, path: str, first_message: str | None) -> str:
    """Where a held websocket opened at ``path`` connects to the engine again (a new process
    after a release): under the name it was given, where the engine names its clients."""
    if first_message is None or not isinstance(engine, NamesWebsockets):
        return path
    return engine.websocket_again(path, first_message)


@runtime_checkable
class EndsStreams(Protocol):
    """What an :class:`Engine` whose page needs to be told that an event stream ended offers
    (Gradio: its page marks a ``queue/data`` stream closed only on ``{"msg": "close_stream"}``,
    and opens no new one before it did); ask through :func:`stream_farewell`."""

    def stream_farewell(self, path: str) -> bytes | None:
        """The last event (whole, blank line included) to send on a stream at this upstream path
        that warmgate ends itself (a release, a shutdown); ``None``: none."""
        ...


def stream_farewell(engine: object, path: str) -> bytes | None:
    """What ends a stream at ``path`` that warmgate closes, as the engine ends it; ``None``."""
    return engine.stream_farewell(path) if isinstance(engine, EndsStreams) else None


@runtime_checkable
class AnswersJson(Protocol):
    """What an :class:`Engine` whose API clients read with a short read timeout offers
    (``gradio_client``: httpx's 5 s for ``/config``, ``{api}/info`` and ``queue/join``, less than
    any cold start): which requests it always answers with JSON, so that warmgate may begin the
    answer of one held through a start and keep its client reading with whitespace; ask through
    :func:`json_answer`."""

    def json_answer(self, method: str, path: str) -> bool:
        """The engine answers ``method path`` (the upstream path, no query) with a JSON body."""
        ...


def json_answer(engine: object, method: str, path: str) -> bool:
    """The engine answers this request with JSON (:class:`AnswersJson`); False where unknown."""
    return isinstance(engine, AnswersJson) and engine.json_answer(method, path)


@runtime_checkable
class ReportsQueue(Protocol):
    """What an :class:`Engine` that tells the depth of its own queue offers (ComfyUI's
    ``queue_remaining``, Gradio's ``queue_size``, vLLM's ``vllm:num_requests_waiting``); ask
    through :func:`queue_reporter`. The depth is read by :meth:`Engine.busy`, the busy poll."""

    def queue_depth(self, base_url: str) -> int | None:
        """Jobs in the engine's queue at ``base_url`` as the last busy poll read them; ``None``
        when that poll got no answer, or the engine does not say."""
        ...


def queue_reporter(engine: Engine) -> ReportsQueue | None:
    """The engine's own queue as its busy poll reads it, or ``None`` for an engine that does not
    tell one (fixed by its class: asked once, not at every poll)."""
    return engine if isinstance(engine, ReportsQueue) else None


def parking(engine: Engine) -> Parkable | None:
    """The engine's park actions, or ``None`` for an engine that is never parked."""
    return engine if isinstance(engine, Parkable) and engine.parks else None
