"""The replay: a trace through warmgate's own decision code on a virtual clock.

Each target is a real :class:`router.scale.targets.TargetRuntime` with its real
:class:`router.scale.lifecycle.Lifecycle` (the pure ``decide``, transitions, drains, holds, the
learned idle policy, ``keep_warm``, parking and waking), over a simulated backend and engine
(:mod:`router.simulate.backends`), in its GPU pool where it has one (the real
:class:`router.scale.pool_runtime.PoolRuntime`: capacity, displacement, waits). Each request of
the trace arrives at its time and does what the dispatcher does with one: a page load to a cold
or parked target gets the waiting page (and the person waits for ready), any other request is
held through :meth:`TargetRuntime.acquire`; then it is in flight for its work. API requests are
placed by the real policy (:mod:`router.simulate.api`). Nothing listens on a port; a day replays
in seconds."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from backends.base import RequestFacts
from backends.registry import make_engine
from router.config import Config
from router.errors import HoldTimeout, RequestError, TargetFailed
from router.metrics import Metrics
from router.scale.lifecycle import Lifecycle
from router.scale.pool_runtime import PoolRuntime
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime
from router.scale.wakes import EXPECTED_WAKE
from router.simulate.backends import Duration, MemoryStore, SimBackend, SimEngine
from router.simulate.clock import VirtualLoop
from router.simulate.trace import Request, Trace

DEFAULT_COLD_START = Duration(60.0, 60.0)
DEFAULT_STOP = Duration(5.0, 5.0)
HELD_PHASES = ("starting", "ready", "draining", "parked")
"""Phases in which a target holds its GPU."""


@dataclass(frozen=True, slots=True)
class Options:
    cold_start: Mapping[str, Duration] = field(default_factory=dict)
    """Per target (``*``: every other one); else what the live server measured
    (``measured``), else the target's expected cold start, else 60 s."""
    measured: Mapping[str, Duration] = field(default_factory=dict)
    """Per target: the cold starts ``warmgate serve`` measured and kept (``state_dir``)."""
    stop: Duration = DEFAULT_STOP
    wake: Mapping[str, Duration] = field(default_factory=dict)
    """A wake from parked, per target (``*``: every other one); else what the live server
    measured (``measured_wake``), else the target's ``scaling.expected_wake``, else 2 s."""
    measured_wake: Mapping[str, Duration] = field(default_factory=dict)
    """Per target: the wakes ``warmgate serve`` measured and kept (``state_dir``)."""
    seed: int = 1
    tokens_per_second: float = 40.0
    """An API request's ``tokens`` in GPU seconds when it runs locally (decode speed)."""
    tail: float = 7200.0
    """Seconds replayed after the last request: every configuration compared gets the same."""
    stores: Mapping[str, MemoryStore] = field(default_factory=dict)
    """Per target: what it learned before (a previous replay), and keeps learning into."""


@dataclass(slots=True)
class Outcome:
    request: Request
    placement: str
    """``local``, ``cloud``, ``rejected`` or ``failed``."""
    waited: float = 0.0
    """Seconds waited for a cold start (or a wake) before the work began."""
    cold: bool = False
    """Met a cold start or a wake."""
    met: str = ""
    """``cold`` (a cold start) or ``wake`` (a wake from parked); empty: neither."""
    cloud_usd: float = 0.0
    reason: str = ""


@dataclass(slots=True)
class TargetRecord:
    phases: list[tuple[float, str]]
    """(seconds from the start, phase), each change."""
    busy: float = 0.0
    """GPU-seconds ready with activity (the lifecycle's own accounting)."""
    idle: float = 0.0
    seconds_in: dict[str, float] = field(default_factory=dict)
    """Seconds in each phase over the replay."""
    cold_starts: int = 0
    parks: int = 0
    wakes: int = 0
    displaced: int = 0
    """Parked or stopped to make room in its GPU pool."""
    pool_waits: int = 0
    """Starts or wakes that waited for room in its GPU pool."""
    idle_after: float = 0.0
    """``idle_after`` in force at the end (learned, for ``auto``)."""
    park_after: float = 0.0
    """``park_after`` in force at the end (0: never parked for idleness)."""
    learned: bool = False
    gaps: int = 0
    """Gaps between bursts ``auto`` learned from."""


@dataclass(slots=True)
class Result:
    label: str
    config: Config
    horizon: float
    targets: dict[str, TargetRecord]
    outcomes: list[Outcome]


def wake_for(name: str, config: Config, options: Options) -> Duration:
    expected = config.targets[name].scaling.expected_wake
    return _chosen(name, options.wake, options.measured_wake, expected, EXPECTED_WAKE)


def cold_start_for(name: str, config: Config, options: Options) -> Duration:
    expected = config.targets[name].scaling.expected_cold_start
    fallback = DEFAULT_COLD_START.low
    return _chosen(name, options.cold_start, options.measured, expected or None, fallback)


def _chosen(
    name: str,
    given: Mapping[str, Duration],
    measured: Mapping[str, Duration],
    expected: float | None,
    fallback: float,
) -> Duration:
    """What the command line gives for ``name`` (or ``*``), else what the live server measured,
    else the config's expected seconds, else ``fallback``."""
    chosen = given.get(name) or given.get("*") or measured.get(name)
    if chosen is not None:
        return chosen
    seconds = fallback if expected is None else expected
    return Duration(seconds, seconds)


def replay(config: Config, trace: Trace, options: Options, label: str = "config") -> Result:
    """Replay ``trace`` through ``config`` on a fresh virtual clock."""
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(Replay(config, trace, options, label, loop).run())
    finally:
        loop.close()


class Replay:
    def __init__(
        self,
        config: Config,
        trace: Trace,
        options: Options,
        label: str,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.config, self.trace, self.options, self.label = config, trace, options, label
        self.loop = loop
        self.rng = random.Random(options.seed)
        self.metrics = Metrics()
        self.runtimes: dict[str, TargetRuntime] = {}
        self.engines: dict[str, SimEngine] = {}
        self.records: dict[str, TargetRecord] = {}
        self.outcomes: list[Outcome] = []
        self._pending = 0
        self._done = asyncio.Event()
        self.error: BaseException | None = None

    def wall(self) -> float:
        return self.trace.start + self.loop.time()

    def _build(self) -> list[Lifecycle]:
        config, loop = self.config, self.loop
        lifecycles = []
        for name, target in config.targets.items():
            backend = SimBackend(
                name, cold_start_for(name, config, self.options), self.options.stop, self.rng
            )
            real = make_engine(target.engine_spec(config.base_dir))
            engine = SimEngine(real, loop, wake_for(name, config, self.options), self.rng)
            backend.engine = engine
            runtime = TargetRuntime(
                name, target, backend, engine, self.metrics, loop, config.economics
            )
            runtime.learned.idling.wall = self.wall
            runtime.learned.store = self.options.stores.get(name)
            record = TargetRecord(phases=[(0.0, runtime.state.phase.value)])
            runtime.cell.subscribe(self._recorder(record))
            self.runtimes[name], self.engines[name], self.records[name] = runtime, engine, record
            lifecycles.append(Lifecycle(runtime))
        for pool, spec in config.pools.items():  # as the wiring does: each member knows its pool
            members = [self.runtimes[n] for n, t in config.targets.items() if t.pool == pool]
            PoolRuntime(pool, spec, members, self.metrics, loop)
        return lifecycles

    def _recorder(self, record: TargetRecord) -> Callable[[TargetState, TargetState], None]:
        def changed(old: TargetState, new: TargetState) -> None:
            if old.phase is not new.phase:
                record.phases.append((self.loop.time(), new.phase.value))

        return changed

    async def run(self) -> Result:
        lifecycles = self._build()
        for lifecycle in lifecycles:
            await lifecycle.open()
        from router.simulate.api import ApiPlacer  # the API side only when models exist

        self.api = ApiPlacer(self) if self.config.models else None
        self._pending = len(self.trace.requests)
        if self.trace.requests:  # one timer at a time: the loop's heap stays small
            self.loop.call_at(self.trace.requests[0].at, self._spawn, 0)
        horizon = self.trace.duration + self.options.tail
        if self._pending:
            await self._done.wait()
        if self.error is not None:
            for lifecycle in lifecycles:
                await lifecycle.close()
            raise self.error
        await asyncio.sleep(max(0.0, horizon - self.loop.time()))
        horizon = max(horizon, self.loop.time())
        for lifecycle in lifecycles:
            await lifecycle.accounting.account()
            await lifecycle.close()
        self._finish(horizon)
        return Result(self.label, self.config, horizon, self.records, self.outcomes)

    def _spawn(self, i: int) -> None:
        """Request ``i`` arrives (and every other due now); the next one is due at its time."""
        requests, now = self.trace.requests, self.loop.time()
        while i < len(requests) and requests[i].at <= now:
            task = self.loop.create_task(self._one(requests[i]))
            task.add_done_callback(self._finished)
            i += 1
        if i < len(requests):
            self.loop.call_at(requests[i].at, self._spawn, i)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._pending -= 1
        error = None if task.cancelled() else task.exception()
        if error is not None and self.error is None:
            self.error = error  # a bug in the replay: surfaced by run()
            self._done.set()
        if self._pending == 0:
            self._done.set()

    async def _one(self, request: Request) -> None:
        if request.model is not None:  # a model's request goes through the API, as it does live
            if self.api is None or request.model not in self.config.models:
                self.outcomes.append(Outcome(request, "rejected", reason="unknown model"))
                return
            await self.api.place(request)
            return
        name = request.target or request.model or ""
        runtime = self.runtimes.get(name)
        if runtime is None:
            self.outcomes.append(Outcome(request, "rejected", reason="unknown target"))
            return
        outcome = await self.local(runtime, request, self.work(request))
        self.outcomes.append(outcome)

    def work(self, request: Request) -> float:
        if request.work_seconds is not None:
            return request.work_seconds
        return (request.tokens or 0) / self.options.tokens_per_second

    async def local(self, runtime: TargetRuntime, request: Request, work: float) -> Outcome:
        """What the dispatcher does with one request, then its work in flight."""
        arrived = self.loop.time()
        page = request.kind == "page"
        facts = RequestFacts(
            method="GET" if page else "POST",
            path="/",
            is_websocket=False,
            is_navigation=page,
        )
        cold = False
        met = ""
        if runtime.servable_now() is None:
            cold = True
            met = "wake" if runtime.state.phase is Phase.PARKED else "cold"
            try:
                if page and runtime.spec.waiting_page == "auto":
                    await self._waiting_page(runtime, facts)
                else:
                    await runtime.acquire(facts)
            except RequestError as exc:
                waited = self.loop.time() - arrived
                return Outcome(request, "failed", waited, cold, met, reason=exc.code)
        waited = self.loop.time() - arrived
        engine = self.engines[runtime.name]
        until = engine.queue(work) if request.kind != "page" else self.loop.time() + work
        with runtime.in_flight():
            await asyncio.sleep(max(0.0, until - self.loop.time()))
        return Outcome(request, "local", waited, cold, met)

    async def _waiting_page(self, runtime: TargetRuntime, facts: RequestFacts) -> None:
        """The waiting page: the start asked for, the person waits until the target serves
        (the page reloads itself then), up to the cold start timeout."""
        if runtime.engine.may_start(facts):
            runtime.request_start(waiting=True)
        elif runtime.state.phase is not Phase.STARTING:
            await runtime.acquire(facts)  # raises: this request does not wake it
        before = runtime.state
        try:
            async with asyncio.timeout(runtime.spec.scaling.cold_start_timeout):
                state = await runtime.cell.wait_for(
                    lambda s: (
                        runtime.servable_now() is not None
                        or (s.phase is Phase.FAILED and s is not before)
                    )
                )
        except TimeoutError:
            raise HoldTimeout("the page waited too long", target=runtime.name) from None
        if state.phase is Phase.FAILED:  # the page shows the failure; the person leaves
            raise TargetFailed("the start failed", target=runtime.name)

    def _finish(self, horizon: float) -> None:
        registry = self.metrics.registry
        for name, record in self.records.items():
            runtime = self.runtimes[name]
            for kind in ("busy", "idle"):
                value = registry.get_sample_value(
                    "warmgate_gpu_seconds_total", {"target": name, "state": kind}
                )
                setattr(record, kind, value or 0.0)

            def count(metric: str, target: str = name, **labels: str) -> int:
                return int(registry.get_sample_value(metric, {"target": target, **labels}) or 0)

            record.cold_starts = count("warmgate_cold_starts_total")
            record.parks = count("warmgate_parks_total")
            record.wakes = count("warmgate_wake_seconds_count")
            pool = runtime.spec.pool
            if pool is not None:
                record.displaced = sum(
                    count("warmgate_pool_displacements_total", pool=pool, how=how)
                    for how in ("park", "stop")
                )
                record.pool_waits = count("warmgate_pool_waits_total", pool=pool)
            spans = [*record.phases, (horizon, "end")]
            for (at, phase), (end, _) in itertools.pairwise(spans):
                record.seconds_in[phase] = record.seconds_in.get(phase, 0.0) + (end - at)
            record.idle_after = runtime.learned.windows().idle_after
            record.park_after = runtime.learned.windows().park_after
            policy = runtime.learned.idling.policy
            record.learned = policy is not None and policy.learned
            record.gaps = 0 if policy is None else policy.gaps
