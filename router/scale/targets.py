"""One target at run time: its config, backend, engine, state cell, activity and metrics.

The proxy asks a :class:`TargetRuntime` for a ready endpoint (holding if needed) and reports
activity to it; the target's lifecycle owns every phase change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager

from backends.base import Backend, CountsRefusals, Engine, RequestFacts, parking
from router.config import Economics, Target
from router.errors import HoldTimeout, NoEndpoint, TargetAsleep
from router.metrics import Metrics
from router.scale.activity import (
    Activity,
    Flights,
    InFlight,
    StreamCloser,
    holding,
    holding_socket,
    stream,
)
from router.scale.engine_queue import EngineQueue
from router.scale.hold import (
    HoldResult,
    admission_error,
    shutting_down,
    wait_ready,
)
from router.scale.learned import Learned
from router.scale.pools import Seats
from router.scale.rollout import RolloutWatch
from router.scale.state import Phase, StateCell, TargetState
from router.scale.supervision import Supervisor
from router.scale.timeline import Timeline
from router.scale.turns import Turns


def _servable(state: TargetState) -> bool:
    """Ready, or draining with the stop not yet issued (a new request cancels that drain)."""
    return state.phase is Phase.READY or (
        state.phase is Phase.DRAINING and not state.stopping and bool(state.endpoints)
    )


def _parked_serves(state: TargetState) -> bool:
    """Parked (its park done, no wake under way) with its process up: a request that does
    not wake it is forwarded there (the engine answers reads without its weights)."""
    return (
        state.phase is Phase.PARKED
        and not state.parking
        and not state.waking
        and bool(state.endpoints)
    )


def _asleep(state: TargetState) -> str:
    """How a target that a request may not wake is asleep, in the words of its phase."""
    if state.phase is Phase.PARKED:
        return "parked"
    if state.phase is Phase.FAILED:
        return "not running (its last start failed)"
    if state.phase is Phase.DRAINING:
        return "being released"
    return "scaled to zero"


class TargetRuntime:
    def __init__(
        self,
        name: str,
        spec: Target,
        backend: Backend,
        engine: Engine,
        metrics: Metrics,
        loop: asyncio.AbstractEventLoop,
        economics: Economics | None = None,
        *,
        assumed_cold_start: float = 30.0,
    ) -> None:
        """``assumed_cold_start``: the ETA of a target never started, where its config names
        no ``scaling.expected_cold_start`` (``policy.assumed_cold_start``)."""
        self.name = name
        self.spec = spec
        self.backend = backend
        self.engine = engine
        self.loop = loop
        now = loop.time()
        observed = backend.observe()
        initial = (
            TargetState(Phase.READY, now, endpoints=observed.endpoints, reason="always on")
            if backend.always_on
            else TargetState(Phase.COLD, now, reason="not started")
        )
        self.cell = StateCell(initial)
        self.activity = Activity(now)
        if isinstance(engine, CountsRefusals):  # an engine's number that was no answer
            refused = metrics.outside_refused
            engine.on_refused = lambda field: refused.labels("engine", field).inc()
        self.can_park = parking(engine) is not None
        """The engine has a park action (fixed by its config: asked once)."""
        self.learned = Learned(
            name,
            spec.scaling,
            economics or Economics(),
            loop,
            parks=self.can_park,
            assumed_cold_start=assumed_cold_start,
        )
        """What it learned (cold starts, wakes, idle gaps), and where that is kept."""
        self.timeline = Timeline(name, loop, self.busy, self.waiting)
        """Its day as a strip of phases, recorded from its state cell (never writing it)."""
        self.cell.subscribe(self.timeline.on_state)
        self.timeline.sample(initial)
        self.rollout = RolloutWatch(
            name,
            loop,
            spec.scaling.rollout_timeout,
            metrics.rollout_failures.labels(name),
            spec.readiness.path,
        )
        """Its rollouts, followed and reported (Kubernetes), from observations and its cell."""
        self.cell.subscribe(self.rollout.on_state)
        self.activity.on_resume = self._resumed
        self.nudge = asyncio.Event()
        """Set to make the lifecycle look again now (a request was held, activity changed)."""
        self.closing = False
        """warmgate is draining (SIGTERM): no cold start begins (:meth:`shut_down`)."""
        self.on_first_hold: list[Callable[[], None]] = []
        """Called when a request is held and none was (KEDA's scaler pushes ``active`` then)."""
        self.pool: Seats | None = None
        """The GPU pool this target takes turns on (set by the wiring); ``None``: none."""
        self.park_asked = False
        """A park was asked for (the dashboard): parked once idle; the lifecycle resets it."""
        self.release_asked = False
        """A release was asked for (the dashboard): released once nothing is at work; dropped
        when the release begins, or when activity resumes first."""
        self._next_endpoint = 0
        self.turns = Turns(loop, spec.release_rate)
        """The line of those a start released (``waiting.release_rate``): :meth:`let_through`."""
        self.endpoint_load: dict[str, int] = {}
        """Requests in flight per endpoint (counted while there are several to choose from)."""
        self.queue = EngineQueue()
        """The engine's own queue as the busy poll reads it, and the time one job takes there:
        the API policy's load and predicted wait for this target while it is ready."""
        self.m_in_flight = metrics.in_flight.labels(name)
        self.m_held = metrics.held_requests.labels(name)
        self.m_hold_seconds = metrics.hold_seconds.labels(name)
        self.m_ws_open = metrics.websockets_open.labels(name)
        self.m_bytes_in = metrics.bytes.labels(name, "in")
        self.m_bytes_out = metrics.bytes.labels(name, "out")
        self.m_request_duration = metrics.request_duration.labels(name)
        self.metrics = metrics
        self.supervisor = Supervisor(name, metrics)
        """Whether the target's lifecycle loop runs, and its last failure."""

    @property
    def state(self) -> TargetState:
        return self.cell.current

    @property
    def stopped_by_warmgate(self) -> bool:
        """A stop of warmgate's own is under way (a release, a stop instead of a park), or
        the target is cold: a stream still open to it breaks because of that, not as a
        failure of the engine's (:mod:`router.http.proxy`)."""
        state = self.cell.current
        return state.stopping or state.phase is Phase.COLD

    def pick_endpoint(self, state: TargetState) -> str:
        """The endpoint with the fewest requests in flight, ties taken round robin. A pick
        counts as in flight until the task that made it ends (aiohttp runs each request in a
        task of its own), so callers need not report back. One endpoint: no counting."""
        endpoints = state.endpoints
        if len(endpoints) == 1:
            return endpoints[0]
        if not endpoints:  # never published so; a snapshot from the instant it changed
            raise NoEndpoint(f"target {self.name!r} has no ready endpoint", retry_after=1.0)
        self._next_endpoint = (self._next_endpoint + 1) % len(endpoints)
        load = self.endpoint_load
        order = endpoints[self._next_endpoint :] + endpoints[: self._next_endpoint]
        base = min(order, key=lambda endpoint: load.get(endpoint, 0))
        task = asyncio.current_task()
        if task is not None:
            load[base] = load.get(base, 0) + 1
            task.add_done_callback(lambda _: self._endpoint_done(base))
        return base

    def _endpoint_done(self, base: str) -> None:
        left = self.endpoint_load.get(base, 0) - 1
        if left > 0:
            self.endpoint_load[base] = left
        else:
            self.endpoint_load.pop(base, None)

    def _resumed(self, now: float) -> None:
        """Activity begins with none before it: the idle rule learns the gap since the last
        burst ended (:meth:`IdleRule.resumed_at`)."""
        activity = self.activity
        self.release_asked = False  # work came first: the operator's release is called off
        if not (activity.held or activity.in_flight):
            window = self.spec.scaling.stream_activity_window
            self.learned.idling.resumed_at(activity.idle_since(window), now)

    def in_flight(self, *, counts: bool = True) -> InFlight:
        """This request counted in flight, now, until its ``with`` block ends."""
        return InFlight(self.activity, self.m_in_flight, self.loop.time, counts=counts)

    def flights(self) -> Flights:
        """One request in flight per job a stream carries, until its ``with`` block ends."""
        return Flights(self.in_flight)

    def holding(self) -> AbstractContextManager[None]:
        """A request held while the block runs (for readiness, or for a free connection)."""
        return holding(self.activity, self.m_held)

    def holding_socket(self) -> AbstractContextManager[None]:
        """A tab's websocket held open while the block runs (``waiting.hold_websockets``)."""
        return holding_socket(self.activity, self.metrics.websockets_held.labels(self.name))

    def stream(
        self, close: StreamCloser, *, websocket: bool = False
    ) -> AbstractContextManager[None]:
        """A long-lived stream open while the block runs, closed with ``close`` at a release or
        at warmgate's shutdown; a ``websocket`` shows on ``warmgate_websockets_open``."""
        return stream(self.activity, close, self.m_ws_open if websocket else None)

    def servable_now(self) -> TargetState | None:
        state = self.cell.current
        return state if _servable(state) else None

    def request_start(self, *, waiting: bool = False) -> None:
        """Start the target if it is cold, without holding a request for it. ``waiting``: a
        person waits for it (the waiting page), which is what a start costs."""
        now = self.loop.time()
        if waiting:
            self.learned.idling.waits.page(now)
        until = now + self.spec.scaling.cold_start_timeout
        if now >= self.activity.wanted_until:
            self._resumed(now)
        self.activity.wanted_until = max(self.activity.wanted_until, until)
        self.activity.last_wanted = now
        self.nudge.set()

    def ask_park(self) -> None:
        """An operator's park (the dashboard): parked once idle, whatever ``park_after``; an
        input the lifecycle decides on."""
        self.park_asked = True
        self.nudge.set()

    def ask_release(self) -> None:
        """An operator's release (the dashboard): released once nothing is at work, whatever
        ``idle_after``; an input the lifecycle decides on (nothing of its clocks moves)."""
        self.release_asked = True
        self.nudge.set()

    def waited(self) -> None:
        """Someone shows they still wait for this target (the waiting page polls): a start
        is not abandoned for ``abandon_after`` from now."""
        self.activity.last_wanted = self.loop.time()

    def busy(self) -> bool:
        """Work now: requests held or in flight, streams carrying traffic, the engine's queue."""
        idle_since = self.activity.idle_since(self.spec.scaling.stream_activity_window)
        return self.activity.held > 0 or idle_since is None or idle_since > self.loop.time()

    def waiting(self) -> int:
        """What counts in ``max_held``: requests held, and websockets held open."""
        return self.activity.held + self.activity.held_sockets

    def _closing(self) -> bool:
        return self.closing

    def shut_down(self) -> None:
        """SIGTERM: from now on no cold start begins; held requests are answered 503."""
        self.closing = True
        self.cell.look_again()
        self.nudge.set()

    async def let_through(self, deadline: float) -> None:
        """Wait for this one's turn among those a start released (held requests, waiting pages
        that continue): ``waiting.release_rate`` a second; at once while there is no line.
        Raises :class:`HoldTimeout` at ``deadline`` (loop time), the request's own."""
        try:
            async with asyncio.timeout_at(deadline):
                await self.turns.take()
        except TimeoutError:
            raise HoldTimeout(
                f"target {self.name!r} is ready, but this request's turn among those its start "
                f"released (waiting.release_rate) did not come before its deadline",
                target=self.name,
                retry_after=1.0,
            ) from None

    async def acquire(self, facts: RequestFacts, *, paced: bool = True) -> HoldResult:
        """A state with endpoints to forward to; holds through a cold start when needed.
        ``paced``: held through a start, it waits for its turn (:meth:`let_through`); a page's
        sub-resource need not.

        The caller must count the request in flight before its next ``await`` (so the lifecycle
        never sees a moment where a released hold is neither held nor in flight)."""
        state = self.cell.current
        if _servable(state):
            return HoldResult(state, 0.0, cold=False)
        now = self.loop.time()
        if not self.engine.may_start(facts):
            if _parked_serves(state):
                # Its process is up without its weights: a read it answers needs no GPU.
                return HoldResult(state, 0.0, cold=False)
            if state.phase is not Phase.STARTING and not state.waking:
                # Only a start that someone else asked for is waited on; held requests are
                # what make the lifecycle start a cold target, so a non-waking one may not be.
                raise TargetAsleep(
                    f"target {self.name!r} is {_asleep(state)}; this request does not wake it",
                    target=self.name,
                    retry_after=10.0,
                )
        error = admission_error(state, self.waiting(), self.spec.scaling.max_held, self.name, now)
        if self.closing:
            raise shutting_down(self.name)  # the drain: no cold start begins
        if error is not None:
            self.metrics.hold_outcomes.labels(
                self.name, "shed" if error.code == "overloaded" else "failed"
            ).inc()
            raise error
        self._resumed(now)
        outcome = "disconnected"
        try:
            with self.holding():
                self.nudge.set()
                if self.activity.held == 1:
                    for listener in self.on_first_hold:
                        listener()
                limit = self.spec.scaling.cold_start_timeout
                result = await wait_ready(self.cell, self.name, limit, self.loop, self._closing)
                if paced:
                    await self.let_through(now + limit)
            state = self.cell.current
            result = HoldResult(
                state if _servable(state) else result.state, self.loop.time() - now, cold=True
            )
            outcome = "ready"
            self.learned.idling.waits.wait(result.waited)  # what a start costs in waiting
            return result
        except Exception as exc:
            outcome = "timeout" if getattr(exc, "status", 0) == 504 else "failed"
            raise
        finally:
            self.activity.last_wanted = self.loop.time()
            self.nudge.set()  # one fewer waits: a start nobody waits for is given up in time
            self.m_hold_seconds.observe(self.loop.time() - now)
            self.metrics.hold_outcomes.labels(self.name, outcome).inc()
