"""Several warmgate replicas agreeing on when a GPU may be released (docs/replicas.md).

Each replica tracks its own activity and serves it on the admin listener
(``GET /replicas/activity``); every replica reads every other one each ``poll_interval`` and
combines: a target is idle only when every replica says so, and a replica that does not answer
counts as active until ``peer_grace`` after it last did. Any replica may scale a target up
(idempotent); only the leader (the Lease holder, :class:`backends.base.Membership`) releases
one, and before it does it *fences* the others (``POST /replicas/fence``): each one that is
idle too holds new requests for the target until the release shows in the cluster (or the
fence times out), so no request can reach a pod that is being stopped. A replica that holds a
request for the first time tells the others at once (``POST /replicas/report``), so a KEDA
scaler connected to another replica hears ``active`` without waiting for a poll. The day's cloud
budget is theirs together too: each replica reports what it spent and reserved today.

:class:`Replicas` is this replica among the others, and what each target's lifecycle sees of
them (:class:`router.scale.coordination.Others`). Its parts: :mod:`router.cluster.combine`
(pure), :mod:`router.cluster.peers` (reading and posting to the others),
:mod:`router.cluster.spend` (the shared budget), :mod:`router.cluster.routes` (the endpoints).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from backends.membership import Membership, Peer
from backends.outside import one_line
from backends.specs import ReplicasSpec
from router.cluster.combine import (
    RESIDENT_PHASES,
    Combined,
    PeerRecord,
    combine,
    combined_to_json,
    own_word,
    seat_for,
    word_to_json,
)
from router.cluster.peers import Peers
from router.cluster.spend import SharedBudget, Spend
from router.metrics import Metrics
from router.scale.coordination import Fenceable
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.replicas")


class Replicas:
    """This replica among the others: reads them, answers them, fences them."""

    def __init__(
        self,
        membership: Membership,
        spec: ReplicasSpec,
        runtimes: Mapping[str, TargetRuntime],
        metrics: Metrics,
        token: str | None = None,
    ) -> None:
        self.membership = membership
        self.spec = spec
        self.runtimes = runtimes
        self.token = token
        """The secret the replicas share (``replicas.token_file``): sent with every request to
        the others, and required of theirs that change state here."""
        idle_afters = [r.spec.scaling.idle_seconds for r in runtimes.values()] or [0.0]
        refused = metrics.outside_refused
        self.peers = Peers(
            membership,
            spec.peer_grace + max(idle_afters),
            self._answer,
            token,
            on_refused=lambda field: refused.labels("peer", field).inc(),
        )
        self.spend = Spend(membership.identity, self.peers.answered)
        self.fenceables: dict[str, Fenceable] = {}
        self._granted: dict[str, float] = {}
        """As the leader: target -> loop time until which a seat it granted counts as held
        (until the start shows in the cluster, or in the replica's report)."""
        self.on_update: list[Callable[[], None]] = []
        """Called after every round of reads and on leadership changes."""
        self._task: asyncio.Task[None] | None = None
        self._pushes: set[asyncio.Task[None]] = set()
        self._leader_gauge = metrics.leader
        self._peer_gauges = {s: metrics.peers.labels(s) for s in ("reachable", "unreachable")}
        for runtime in runtimes.values():
            runtime.on_first_hold.append(self._push_soon)

    @property
    def identity(self) -> str:
        return self.membership.identity

    @property
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    @property
    def records(self) -> Mapping[str, PeerRecord]:
        """The other replicas as last heard, by name."""
        return self.peers.records

    # -- what a target's lifecycle sees of the others (router.scale.coordination.Others) --

    @property
    def fence_timeout(self) -> float:
        return self.spec.fence_timeout

    @property
    def poll_interval(self) -> float:
        return self.spec.poll_interval

    def leading(self) -> bool:
        return self.membership.leading()

    async def confirm_leading(self) -> bool:
        return await self.membership.confirm()

    def idle_since(self, target: str) -> float | None:
        return self.combined(target).idle_since

    def wanted(self, target: str) -> bool:
        combined = self.combined(target)
        return combined.held > 0 or combined.wanted_until > self.now

    def add_fenceable(self, target: str, fenceable: Fenceable) -> None:
        self.fenceables[target] = fenceable

    # -- life -----------------------------------------------------------------------------

    async def open(self) -> None:
        self.peers.open(self.spec.poll_interval)
        await self.membership.open(self._membership_changed)
        await self.poll()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="replicas")

    async def close(self) -> None:
        for task in [self._task, *self._pushes]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.membership.close()
        await self.peers.close()

    def _membership_changed(self) -> None:
        self._leader_gauge.set(1 if self.membership.leading() else 0)
        self._notify()

    def _notify(self) -> None:
        for runtime in self.runtimes.values():
            runtime.nudge.set()
        for listener in self.on_update:
            listener()

    # -- reading the others ---------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.spec.poll_interval)
            try:
                await self.poll()
            except Exception:  # a round that fails must never end the reading of the others
                log.exception("reading the other replicas failed")

    async def poll(self) -> None:
        """Read every listed replica once, at the same time; forget long-gone ones."""
        await self.peers.read_all()
        self.spend.forget_days_gone()
        reachable, unreachable = self.peers.counts()
        self._peer_gauges["reachable"].set(reachable)
        self._peer_gauges["unreachable"].set(unreachable)
        self._leader_gauge.set(1 if self.membership.leading() else 0)
        self._notify()

    def _answer(self, replica: str, body: Mapping[str, Any]) -> None:
        self.spend.heard(replica, body.get("budget"))

    def share_budget(self, budget: SharedBudget) -> None:
        """The day's cloud budget (the OpenAI API's) is the replicas' together."""
        self.spend.share(budget)

    def combined(self, name: str) -> Combined:
        runtime = self.runtimes[name]
        records = self.records.values()
        return combine(own_word(runtime), records, name, self.now, self.spec.peer_grace)

    # -- answering the others -------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        now = self.now
        out: dict[str, Any] = {
            "replica": self.identity,
            "leader": self.membership.leading(),
            "targets": {
                name: word_to_json(own_word(runtime), now)
                for name, runtime in self.runtimes.items()
            },
        }
        budget = self.spend.to_json()
        if budget is not None:
            out["budget"] = budget
        return out

    def heard_from(self, body: Any) -> None:
        """A report another replica pushed (it holds a request for the first time)."""
        if self.peers.heard_from(body):
            with contextlib.suppress(Exception):
                self._notify()

    def _push_soon(self) -> None:
        """A request was held here for the first time: tell every other replica now."""
        task = asyncio.get_running_loop().create_task(self._push())
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    async def _push(self) -> None:
        peers = [r.peer for r in self.records.values()]
        await self.peers.post_all(peers, "/replicas/report", self.report())

    # -- seats in a GPU pool, counted once for the cluster ----------------------------------

    async def grant(self, pool: str, target: str) -> str | None:
        """A seat of ``pool`` for ``target`` to start or wake in: granted by the leader (by
        this replica when it leads), so two replicas never fill one seat at once; ``None``
        when granted, else what it waits for."""
        if self.leading():
            return self.grant_here(pool, target)
        now, grace = self.now, self.spec.peer_grace
        leaders = [r for r in self.records.values() if r.leader and now - r.heard_at < grace]
        if not leaders:
            return "waiting for the GPU: no leader of the replicas to grant it"
        leader = leaders[0].peer
        body = {"pool": pool, "target": target, "replica": self.identity}
        answer = await self.peers.post(leader, "/replicas/grant", body)
        if answer is None:
            return f"waiting for the GPU: the leader {leader.name} did not answer"
        if answer.get("granted") is True:
            return None
        return one_line(answer.get("reason") or f"waiting for the GPU: refused by {leader.name}")

    def grant_here(self, pool: str, target: str) -> str | None:
        """As the leader: a seat of ``pool`` for ``target``, counting what is resident here,
        what every other replica said is resident there, and the seats granted and not yet
        shown (:func:`router.cluster.combine.seat_for`)."""
        if not self.leading():
            return "waiting for the GPU: this replica is no longer the leader"
        members = [rt for rt in self.runtimes.values() if rt.pool and rt.pool.name == pool]
        if not members or target not in {rt.name for rt in members}:
            return f"no target {target!r} in a pool {pool!r} here"
        now, grace = self.now, self.spec.peer_grace
        heard = [r for r in self.records.values() if now - r.heard_at < grace]
        holders: dict[str, str] = {}
        for runtime in members:
            name = runtime.name
            if runtime.state.resident:
                holders[name] = "here"
            for record in heard:
                word = record.words.get(name)
                if word is not None and word.phase in RESIDENT_PHASES:
                    holders.setdefault(name, f"on {record.peer.name}")
            if self._granted.get(name, -math.inf) > now:
                holders.setdefault(name, "granted")
        capacity = members[0].pool.capacity if members[0].pool is not None else 1
        refused = seat_for(target, capacity, holders)
        if refused is None:
            self._granted[target] = now + self.spec.fence_timeout
        return refused

    # -- fencing --------------------------------------------------------------------------

    async def fence_others(self, target: str, needed: float | None = None) -> str | None:
        """Ask every other replica to hold new requests for ``target``: ``None`` when all
        did, else why not (the ones fenced are let go again)."""
        self.peers.sync()
        now, grace = self.now, self.spec.peer_grace
        records = self.records.values()
        asked = [r for r in records if r.listed or now - r.heard_at < grace]
        body: dict[str, Any] = {
            "target": target,
            "leader": self.identity,
            "seconds": self.spec.fence_timeout,
        }
        if needed is not None:  # a park: idle for less than idle_after will do
            body["idle"] = needed
        answers = await self.peers.post_all([r.peer for r in asked], "/replicas/fence", body)
        refused: list[str] = []
        for record, answer in zip(asked, answers, strict=True):
            if answer is None:
                if self.now - record.heard_at < grace:
                    refused.append(f"replica {record.peer.name} did not answer")
            elif not answer.get("fenced"):
                refused.append(f"replica {record.peer.name}: {answer.get('reason') or 'active'}")
        if refused:  # every one asked: a fence may have arrived whose answer did not
            await self.unfence_others(target, [r.peer for r in asked])
            return "; ".join(refused)
        return None

    async def unfence_others(self, target: str, peers: Iterable[Peer] | None = None) -> None:
        records = self.records.values()
        chosen = list(peers) if peers is not None else [r.peer for r in records]
        body = {"target": target, "leader": self.identity}
        await self.peers.post_all(chosen, "/replicas/unfence", body)

    async def parked_others(self, target: str) -> None:
        peers = [r.peer for r in self.records.values()]
        body = {"target": target, "leader": self.identity, "parked": True}
        await self.peers.post_all(peers, "/replicas/unfence", body)

    def fence(
        self, target: str, seconds: float, leader: str, needed: float | None = None
    ) -> str | None:
        fenceable = self.fenceables.get(target)
        if fenceable is None:
            return f"no target {target!r} here"
        if not math.isfinite(seconds):
            return "seconds must be a finite number"
        seconds = min(max(0.0, seconds), self.spec.fence_timeout)  # never longer than ours
        if needed is not None and not math.isfinite(needed):
            return "idle must be a finite number"
        return fenceable.fence(self.now + seconds, leader, needed)

    def unfence(self, target: str, parked: bool = False) -> None:
        fenceable = self.fenceables.get(target)
        if fenceable is not None:
            fenceable.unfence(parked=parked)

    def describe(self) -> dict[str, Any]:
        now = self.now
        return {
            "replica": self.identity,
            "leader": self.membership.leading(),
            "problems": self.membership.problems(),
            "peers": [
                {
                    "name": r.peer.name,
                    "url": r.peer.url,
                    "listed": r.listed,
                    "reachable": r.reachable,
                    "heard_seconds_ago": None
                    if r.last_contact is None
                    else round(now - r.last_contact, 3),
                    "error": r.error,
                    "targets": {n: word_to_json(w, now) for n, w in r.words.items()},
                }
                for r in self.records.values()
            ],
            "targets": {name: combined_to_json(self.combined(name), now) for name in self.runtimes},
        }
