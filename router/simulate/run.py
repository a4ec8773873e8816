"""The replay: a trace through warmgate's own decision code on a virtual clock.

Each target is a real :class:`router.scale.targets.TargetRuntime` with its real
:class:`router.scale.lifecycle.Lifecycle` (the pure ``decide``, transitions, drains, holds, the
learned idle policy, ``keep_warm``), over a simulated backend and engine
(:mod:`router.simulate.backends`). Each request of the trace arrives at its time and does what the
dispatcher does with one: a page load to a cold target gets the waiting page (and the person waits
for ready), any other request is held through :meth:`TargetRuntime.acquire`; then it is in
flight for its work. API requests are placed by the real policy
(:mod:`router.simulate.api`). Nothing listens on a port; a day replays in seconds."""

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
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime
from router.simulate.backends import Duration, SimBackend, SimEngine
from router.simulate.clock import VirtualLoop
from router.simulate.trace import Request, Trace

DEFAULT_COLD_START = Duration(60.0, 60.0)
DEFAULT_STOP = Duration(5.0, 5.0)
HELD_PHASES = ("starting", "ready", "draining", "parked")
"""Phases in which a target holds its GPU."""


@dataclass(frozen=True, slots=True)
class Options:
    cold_start: Mapping[str, Duration] = field(default_factory=dict)
    """Per target (``*``: every other one); else the target's expected cold start, else 60 s."""
    stop: Duration = DEFAULT_STOP
    seed: int = 1
    tokens_per_second: float = 40.0
    """An API request's ``tokens`` in GPU seconds when it runs locally (decode speed)."""
    tail: float = 7200.0
    """Seconds replayed after the last request: every configuration compared gets the same."""


@dataclass(slots=True)
class Outcome:
    request: Request
    placement: str
    """``local``, ``cloud``, ``rejected`` or ``failed``."""
    waited: float = 0.0
    """Seconds waited for a cold start (or a wake) before the work began."""
    cold: bool = False
    """Met a cold start or a wake."""
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
    idle_after: float = 0.0
    """``idle_after`` in force at the end (learned, for ``auto``)."""
    learned: bool = False


@dataclass(slots=True)
class Result:
    label: str
    config: Config
    horizon: float
    targets: dict[str, TargetRecord]
    outcomes: list[Outcome]


def cold_start_for(name: str, config: Config, options: Options) -> Duration:
    given = options.cold_start.get(name) or options.cold_start.get("*")
    if given is not None:
        return given
    expected = getattr(config.targets[name].scaling, "expected_cold_start", None)
    if isinstance(expected, int | float) and expected > 0:
        return Duration(float(expected), float(expected))
    return DEFAULT_COLD_START


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
            engine = SimEngine(make_engine(target.engine_spec(config.base_dir)), loop)
            runtime = TargetRuntime(
                name, target, backend, engine, self.metrics, loop, config.economics
            )
            runtime.idling.wall = self.wall
            record = TargetRecord(phases=[(0.0, runtime.state.phase.value)])
            runtime.cell.subscribe(self._recorder(record))
            self.runtimes[name], self.engines[name], self.records[name] = runtime, engine, record
            lifecycles.append(Lifecycle(runtime))
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
        for request in self.trace.requests:
            self.loop.call_at(request.at, self._spawn, request)
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

    def _spawn(self, request: Request) -> None:
        task = self.loop.create_task(self._one(request))
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._pending -= 1
        error = None if task.cancelled() else task.exception()
        if error is not None and self.error is None:
            self.error = error  # a bug in the replay: surfaced by run()
            self._done.set()
        if self._pending == 0:
            self._done.set()

    async def _one(self, request: Request) -> None:
        if request.kind == "api" and request.model is not None:
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
        if runtime.servable_now() is None:
            cold = True
            try:
                if page and runtime.spec.waiting_page == "auto":
                    await self._waiting_page(runtime, facts)
                else:
                    await runtime.acquire(facts)
            except RequestError as exc:
                waited = self.loop.time() - arrived
                return Outcome(request, "failed", waited, cold, reason=exc.code)
        waited = self.loop.time() - arrived
        engine = self.engines[runtime.name]
        until = engine.queue(work) if request.kind != "page" else self.loop.time() + work
        runtime.activity.begin(self.loop.time())
        try:
            await asyncio.sleep(max(0.0, until - self.loop.time()))
        finally:
            runtime.activity.end(self.loop.time())
        return Outcome(request, "local", waited, cold)

    async def _waiting_page(self, runtime: TargetRuntime, facts: RequestFacts) -> None:
        """The waiting page: the start asked for, the person waits until the target serves
        (the page reloads itself then), up to the cold start timeout."""
        if runtime.may_wake(facts):
            runtime.request_start()
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
            starts = registry.get_sample_value("warmgate_cold_starts_total", {"target": name})
            record.cold_starts = int(starts or 0)
            spans = [*record.phases, (horizon, "end")]
            for (at, phase), (end, _) in itertools.pairwise(spans):
                record.seconds_in[phase] = record.seconds_in.get(phase, 0.0) + (end - at)
            record.idle_after = runtime.idle_after()
            policy = runtime.idling.policy
            record.learned = policy is not None and policy.learned
