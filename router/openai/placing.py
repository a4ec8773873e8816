"""Placing one call: a snapshot of its model's placements, :func:`router.openai.policy.decide`,
and the act loop (forward locally, hold, call the cloud; after a cloud failure decide again with
only local left). The decision is recorded on the request (``X-Warmgate-Decision``), counted and
logged before it is acted on."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping

import aiohttp
from aiohttp import web
from prometheus_client import Counter as PromCounter

from backends.cloud_api import Cloud
from router.config import Config
from router.errors import RequestError
from router.openai.budget import Budget
from router.openai.call import DECISION, PATHS, Call
from router.openai.cloud import CloudCaller, CloudUnavailable
from router.openai.errors import BudgetExhausted, CloudFailed, NotPlaced
from router.openai.facts import CloudOption, LocalOption, Rules, Snapshot
from router.openai.images import ComfyImages, load_workflow
from router.openai.local import api_facts, forward_local
from router.openai.policy import Action, Decision, decide
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.access")


class Placer:
    """Where each call goes, and going there: the local targets (``runtimes`` and their
    sessions), the clouds whose key is set, the day's budget."""

    def __init__(
        self,
        config: Config,
        runtimes: Mapping[str, TargetRuntime],
        sessions: Mapping[str, aiohttp.ClientSession],
        clouds: Mapping[str, Cloud],
        budget: Budget,
        decisions: PromCounter,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.policy = config.policy
        self.trust_forwarded = config.server.trust_forwarded
        self.runtimes = runtimes
        self.sessions = sessions
        self.available = frozenset(clouds)
        """The clouds that may be called (their API key is set)."""
        self.budget = budget
        self.decisions = decisions
        self.loop = loop
        self.rules = Rules(config.policy.overflow_queue_depth, config.policy.warm_on_cloud)
        self.loads: Counter[str] = Counter()
        """API requests in progress per local target (event streams included)."""
        retries = {name: spec.retries for name, spec in config.clouds.items()}
        self.cloud = CloudCaller(clouds, retries, budget)
        self.images = ComfyImages(self.loads)
        self.workflows = {
            (model, i): load_workflow(config.base_dir, p.workflow)
            for model, spec in config.models.items()
            for i, p in enumerate(spec.placements)
            if p.workflow is not None
        }
        self._start_rules: dict[tuple[str, str], bool] = {}

    async def close(self) -> None:
        await self.images.close()

    def snapshot(self, call: Call) -> Snapshot:
        """Every placement of the call's model as it is now: what :func:`decide` reads."""
        locals_: list[LocalOption] = []
        clouds: list[CloudOption] = []
        for i, p in enumerate(call.spec.placements):
            target = p.target
            if target is not None:
                rt = self.runtimes[target]
                state, activity = rt.cell.current, rt.activity
                servable = rt.servable_now() is not None
                queue = rt.queue.depth if servable else 0  # the engine's own, at the busy poll
                locals_.append(
                    LocalOption(
                        i,
                        target,
                        state.phase,
                        state.since,
                        servable,
                        max(self.loads[target], activity.in_flight, queue),
                        rt.waiting(),
                        rt.spec.scaling.max_held,
                        self._predicted(rt),
                        state.retry_at,
                        self._may_start(rt, call.kind),
                        wake=rt.learned.wakes.predicted(),
                        waking=state.waking,
                        pool_wait=pool_wait(rt),
                        unschedulable=_unschedulable(state),
                        queue=queue,
                        queue_wait=rt.queue.wait() if queue else 0.0,
                    )
                )
            else:
                assert p.cloud is not None and p.model is not None
                cost = call.bound.price(p.cost)
                clouds.append(CloudOption(i, p.cloud, p.model, p.cloud in self.available, cost))
        return Snapshot(tuple(locals_), tuple(clouds), self.budget.left(), self.loop.time())

    def _may_start(self, runtime: TargetRuntime, kind: str) -> bool:
        """Whether an API request may start the target (the engine's rule; fixed by config)."""
        key = (runtime.name, kind)
        may = self._start_rules.get(key)
        if may is None:
            may = self._start_rules[key] = runtime.engine.may_start(api_facts(PATHS[kind]))
        return may

    def _predicted(self, runtime: TargetRuntime) -> float:
        return runtime.learned.predicted_cold_start()

    def _record(self, call: Call, decision: Decision) -> None:
        call.request[DECISION] = decision.header
        self.decisions.labels(call.model, decision.placement, decision.reason).inc()
        log.debug(
            "%s: %s -> %s (%s)", call.request_id, call.model, decision.header, decision.detail
        )
        if decision.warm is not None:
            self.runtimes[decision.warm].request_start()
            call.notes["warming"] = decision.warm

    async def place(self, call: Call) -> web.StreamResponse:
        """Decide, act, and after a cloud failure decide once more; a refusal is raised."""
        ask = call.ask
        failure: CloudUnavailable | None = None
        while True:
            decision = decide(ask, self.snapshot(call), self.rules)
            self._record(call, decision)
            if decision.action is Action.REJECT:
                raise _rejection(decision, failure)
            if decision.action is not Action.CLOUD:
                assert decision.local is not None
                return await self._local(call, decision.local.position)
            assert decision.cloud is not None and not ask.private
            try:
                return await self.cloud.run(call, call.spec.placements[decision.cloud.position])
            except CloudUnavailable as exc:
                if failure is not None or not any(p.target for p in call.spec.placements):
                    raise CloudFailed(str(exc)) from None
                failure = exc
                waited = self.loop.time() - call.started
                ask = dataclasses.replace(ask, cloud_failed=True, waited=waited)
                call.notes["cloud_failed"] = exc.error.kind

    async def _local(self, call: Call, index: int) -> web.StreamResponse:
        placement = call.spec.placements[index]
        assert placement.target is not None
        runtime = self.runtimes[placement.target]
        session = self.sessions[placement.target]
        if call.kind == "images":
            workflow = self.workflows[(call.model, index)]
            return await self.images.generate(call, runtime, session, placement, workflow)
        return await forward_local(
            call, runtime, session, placement, self.loads, trust_forwarded=self.trust_forwarded
        )


def pool_wait(runtime: TargetRuntime) -> str:
    """What a start or wake of the target would wait for in its full GPU pool when nothing in
    it may be displaced yet (an unknown wait); empty when it would go, or make room first."""
    pool = runtime.pool
    if pool is None or runtime.state.resident:
        return ""
    wait = pool.wait_if_wanted(runtime.name)
    return wait.reason if wait is not None and not wait.victim else ""


def _unschedulable(state: TargetState) -> str:
    """The scheduler's words while a start waits for a GPU that other work holds; else empty."""
    if state.phase is Phase.STARTING and state.stage == "unschedulable":
        return state.stage_message or "no node can take it now"
    return ""


def _rejection(decision: Decision, failure: CloudUnavailable | None) -> RequestError:
    if decision.status == 429:
        return BudgetExhausted(decision.detail)
    if decision.status == 502:
        cause = f"{failure.error.message}; " if failure is not None else ""
        return CloudFailed(cause + decision.detail)
    return NotPlaced(decision.detail)
