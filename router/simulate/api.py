"""API requests in the replay: placed by the real policy (:func:`router.openai.policy.decide`)
against the real daily budget (:class:`router.openai.budget.Budget`, on the replay's wall clock),
from the same snapshot of placements the live API builds (``router.openai.placing``); then run
locally (held through a cold start when the policy holds) or sent to a simulated cloud that
answers in the request's work time and charges its output tokens at the placement's prices."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

from backends.base import RequestFacts
from router.openai.budget import Budget
from router.openai.costs import Bound
from router.openai.facts import Ask, CloudOption, LocalOption, Rules, Snapshot
from router.openai.placing import pool_wait
from router.openai.policy import Action, decide
from router.simulate.trace import Request

if TYPE_CHECKING:
    from router.simulate.run import Outcome, Replay

_API_FACTS = RequestFacts(
    method="POST", path="/v1/chat/completions", is_websocket=False, is_navigation=False
)


class ApiPlacer:
    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        config = replay.config
        self.policy = config.policy
        self.rules = Rules(config.policy.overflow_queue_depth, config.policy.warm_on_cloud)
        self.budget = Budget(config.policy.daily_cloud_budget_usd, clock=replay.wall)
        self.loads: Counter[str] = Counter()

    def snapshot(self, request: Request) -> Snapshot:
        replay = self.replay
        spec = replay.config.models[request.model or ""]
        bound = self.bound(spec.kind, request)
        locals_: list[LocalOption] = []
        clouds: list[CloudOption] = []
        for i, p in enumerate(spec.placements):
            if p.target is not None:
                rt = replay.runtimes[p.target]
                state, activity = rt.state, rt.activity
                locals_.append(
                    LocalOption(
                        i,
                        p.target,
                        state.phase,
                        state.since,
                        rt.servable_now() is not None,
                        max(self.loads[p.target], activity.in_flight),
                        activity.held,
                        rt.spec.scaling.max_held,
                        rt.learned.predicted_cold_start(),
                        state.retry_at,
                        rt.engine.may_start(_API_FACTS),
                        wake=rt.learned.wakes.predicted(),
                        waking=state.waking,
                        pool_wait=pool_wait(rt),
                    )
                )
            elif p.cloud is not None and p.model is not None:
                clouds.append(CloudOption(i, p.cloud, p.model, True, bound.price(p.cost)))
        return Snapshot(tuple(locals_), tuple(clouds), self.budget.left(), replay.loop.time())

    def bound(self, kind: str, request: Request) -> Bound:
        """What the cloud charges for: an image per request of an images model; the request's
        tokens, else its work time at ``--tokens-per-second`` (an access log's request)."""
        if kind == "images":
            return Bound(images=1)
        tokens = request.tokens
        if tokens is None:
            tokens = round((request.work_seconds or 0.0) * self.replay.options.tokens_per_second)
        return Bound(input_tokens=tokens) if kind == "embeddings" else Bound(output_tokens=tokens)

    async def place(self, request: Request) -> None:
        from router.simulate.run import Outcome

        replay = self.replay
        spec = replay.config.models[request.model or ""]
        max_wait = spec.max_wait if spec.max_wait is not None else self.policy.max_wait
        ask = Ask(private=request.private, max_wait=max_wait)
        decision = decide(ask, self.snapshot(request), self.rules)
        if decision.warm is not None:
            replay.runtimes[decision.warm].request_start()
        if decision.action is Action.REJECT:
            replay.outcomes.append(Outcome(request, "rejected", reason=decision.reason))
            return
        if decision.action is Action.CLOUD and decision.cloud is not None:
            replay.outcomes.append(await self._cloud(request, decision.cloud))
            return
        assert decision.local is not None
        target = decision.local.target
        self.loads[target] += 1
        try:
            outcome = await replay.local(replay.runtimes[target], request, replay.work(request))
        finally:
            self.loads[target] -= 1
        outcome.reason = decision.reason
        replay.outcomes.append(outcome)

    async def _cloud(self, request: Request, cloud: CloudOption) -> Outcome:
        from router.simulate.run import Outcome

        reservation = self.budget.reserve(cloud.cost, cloud.cloud)
        if reservation is None:  # another request took what was left meanwhile
            return Outcome(request, "rejected", reason="budget_exhausted")
        await asyncio.sleep(self.replay.work(request))
        self.budget.settle(reservation, cloud.cost)
        return Outcome(request, "cloud", cloud_usd=cloud.cost, reason="cloud")
