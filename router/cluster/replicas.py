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

:func:`combine` is pure; :class:`Replicas` does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from backends.base import Membership, Peer
from backends.specs import ReplicasSpec
from router.metrics import Metrics
from router.openai.budget import Budget
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.replicas")

REQUEST_TIMEOUT = 2.0
"""Seconds one read of a peer, a fence or a report may take."""


# -- what one replica says of one target ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Word:
    """One target on one replica, as that replica last said, in this replica's loop time."""

    held: int = 0
    in_flight: int = 0
    idle_since: float | None = None
    """``None``: active (requests in flight, a busy engine, a stream with traffic)."""
    wanted_until: float = -math.inf
    phase: str = "cold"

    @property
    def active(self) -> bool:
        """Requests held or in flight, activity within its window, or a start under way (a
        replica that probes the workload it found running would refuse a fence)."""
        return (
            self.idle_since is None
            or self.held > 0
            or self.in_flight > 0
            or self.phase == "starting"
        )


@dataclass
class PeerRecord:
    peer: Peer
    first_seen: float
    last_contact: float | None = None
    """Loop time of the last answer."""
    words: dict[str, Word] = field(default_factory=dict)
    reachable: bool = False
    """The last read was answered."""
    listed: bool = True
    """Still among the Service's endpoints."""
    error: str | None = None

    @property
    def heard_at(self) -> float:
        """When it last answered, or (never yet) when it was first listed."""
        return self.last_contact if self.last_contact is not None else self.first_seen


@dataclass(frozen=True, slots=True)
class Combined:
    """A target over all replicas."""

    idle_since: float | None
    """``None``: some replica is active, or cannot be heard and its grace has not run out."""
    held: int
    in_flight: int
    wanted_until: float
    why_active: str = ""


def combine(
    own: Word, records: Iterable[PeerRecord], target: str, now: float, grace: float
) -> Combined:
    """This replica's word and the others': idle only when every replica is idle; a replica
    not heard for up to ``grace`` seconds counts as active; past that, its last word stands (if
    it was active then, it counts as idle only from when it was last heard)."""
    idle_since, held, in_flight, wanted = own.idle_since, own.held, own.in_flight, own.wanted_until
    why = "this replica is active" if own.active else ""
    for record in records:
        contact = record.heard_at
        word = record.words.get(target)
        silent = not record.reachable or record.last_contact is None
        if word is not None:
            held += word.held
            in_flight += word.in_flight
            wanted = max(wanted, word.wanted_until)
        if silent and now - contact < grace:
            why = why or f"replica {record.peer.name} is not answering (grace {grace:g}s)"
            idle_since = None
            continue
        if word is None:
            if silent and idle_since is not None:
                idle_since = max(idle_since, contact)
            continue
        if word.active:
            if silent:  # gone long enough: active when last heard
                if idle_since is not None:
                    idle_since = max(idle_since, contact)
                continue
            why = why or f"replica {record.peer.name} is active"
            idle_since = None
        elif idle_since is not None and word.idle_since is not None:
            idle_since = max(idle_since, word.idle_since)
    return Combined(idle_since, held, in_flight, wanted, why)


def own_word(runtime: TargetRuntime) -> Word:
    activity = runtime.activity
    return Word(
        held=activity.held,
        in_flight=activity.in_flight,
        idle_since=activity.idle_since(runtime.spec.scaling.stream_activity_window),
        wanted_until=activity.wanted_until,
        phase=runtime.state.phase.value,
    )


def alone(runtime: TargetRuntime) -> Combined:
    """A target on this replica when it is the only one."""
    word = own_word(runtime)
    return Combined(word.idle_since, word.held, word.in_flight, word.wanted_until)


def word_to_json(word: Word, now: float) -> dict[str, Any]:
    """Times relative to now: two replicas' loop clocks share nothing but their rate."""
    return {
        "phase": word.phase,
        "held": word.held,
        "in_flight": word.in_flight,
        "idle_for": None if word.idle_since is None else round(now - word.idle_since, 3),
        "wanted_for": round(max(0.0, word.wanted_until - now), 3),
    }


def word_from_json(data: Mapping[str, Any], now: float) -> Word:
    idle_for = data.get("idle_for")
    wanted_for = float(data.get("wanted_for") or 0.0)
    return Word(
        held=int(data.get("held") or 0),
        in_flight=int(data.get("in_flight") or 0),
        idle_since=None if idle_for is None else now - float(idle_for),
        wanted_until=now + wanted_for if wanted_for > 0 else -math.inf,
        phase=str(data.get("phase") or "cold"),
    )


# -- the I/O ------------------------------------------------------------------------------------


class Fenceable(Protocol):
    """What a target's lifecycle offers the leader of another replica."""

    def fence(self, until: float, leader: str) -> str | None:
        """Hold new requests until ``until`` for a release ``leader`` is about to make; ``None``
        if done, else why not (this replica is active)."""
        ...

    def unfence(self) -> None: ...


class Replicas:
    """This replica among the others: reads them, answers them, fences them."""

    def __init__(
        self,
        membership: Membership,
        spec: ReplicasSpec,
        runtimes: Mapping[str, TargetRuntime],
        metrics: Metrics,
    ) -> None:
        self.membership = membership
        self.spec = spec
        self.runtimes = runtimes
        self.records: dict[str, PeerRecord] = {}
        self.fenceables: dict[str, Fenceable] = {}
        self.on_update: list[Callable[[], None]] = []
        """Called after every round of reads and on leadership changes."""
        self.budget: Budget | None = None
        """The day's cloud budget, when the OpenAI API is served: shared with the others."""
        self.spend: dict[str, tuple[datetime.date, float]] = {}
        """USD each other replica spent and reserved, by its name: (day, USD) as last heard;
        kept after the replica is gone (what it spent today stays spent)."""
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._pushes: set[asyncio.Task[None]] = set()
        self._leader_gauge = metrics.leader
        self._peer_gauges = {s: metrics.peers.labels(s) for s in ("reachable", "unreachable")}
        idle_afters = [r.spec.scaling.idle_after for r in runtimes.values()] or [0.0]
        self._forget_after = spec.peer_grace + max(idle_afters)
        for runtime in runtimes.values():
            runtime.on_first_hold.append(self._push_soon)

    @property
    def identity(self) -> str:
        return self.membership.identity

    @property
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def leading(self) -> bool:
        return self.membership.leading()

    # -- life -----------------------------------------------------------------------------

    async def open(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=min(REQUEST_TIMEOUT, self.spec.poll_interval * 2)),
            trust_env=False,
        )
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
        if self._session is not None:
            await self._session.close()

    def _membership_changed(self) -> None:
        self._leader_gauge.set(1 if self.membership.leading() else 0)
        self._notify()

    def _notify(self) -> None:
        for runtime in self.runtimes.values():
            runtime.wake.set()
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

    def _sync_records(self) -> list[str]:
        """Records for the replicas listed now (new ones start unheard); returns their names."""
        now = self.now
        listed = {peer.name: peer for peer in self.membership.peers()}
        for name, peer in listed.items():
            record = self.records.get(name)
            if record is None or record.peer != peer:
                self.records[name] = PeerRecord(peer, first_seen=now)
            else:
                record.listed = True
        for name, record in list(self.records.items()):
            if name not in listed:
                record.listed = False
                if now - record.heard_at > self._forget_after:
                    del self.records[name]
        return list(listed)

    async def poll(self) -> None:
        """Read every listed replica once, at the same time; forget long-gone ones."""
        listed = self._sync_records()
        await asyncio.gather(*(self._read(self.records[name]) for name in listed))
        if self.budget is not None:  # a day gone by is nobody's spend any more
            today = self.budget.mine()[0]
            self.spend = {n: (day, usd) for n, (day, usd) in self.spend.items() if day >= today}
        reachable = sum(r.reachable for r in self.records.values() if r.listed)
        unreachable = sum(not r.reachable for r in self.records.values())
        self._peer_gauges["reachable"].set(reachable)
        self._peer_gauges["unreachable"].set(unreachable)
        self._leader_gauge.set(1 if self.membership.leading() else 0)
        self._notify()

    async def _read(self, record: PeerRecord) -> None:
        assert self._session is not None
        try:
            async with self._session.get(record.peer.url + "/replicas/activity") as resp:
                resp.raise_for_status()
                body = await resp.json()
            self._heard(record, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # refused, timed out, or an answer that makes no sense
            if record.reachable or record.error is None:
                log.warning("replica %s not answering: %r", record.peer.name, exc)
            record.reachable, record.error = False, repr(exc)

    def share_budget(self, budget: Budget) -> None:
        self.budget = budget
        budget.others = self.others_spend

    def others_spend(self, day: datetime.date) -> float:
        return sum(usd for on, usd in self.spend.values() if on == day)

    def _remember_spend(self, name: str, day: datetime.date, usd: float) -> None:
        """Another replica's spend as a third one remembers it: the highest word wins, and
        never over the replica's own (while it is heard) or this one's (echoed back)."""
        record = self.records.get(name)
        if name == self.identity or (record is not None and record.last_contact is not None):
            return
        known = self.spend.get(name)
        if known is None or known[0] < day or (known[0] == day and known[1] < usd):
            self.spend[name] = (day, usd)

    def _heard(self, record: PeerRecord, body: Any) -> None:
        now = self.now
        targets = body.get("targets") if isinstance(body, dict) else None
        if not isinstance(targets, dict):
            raise ValueError("expected {'targets': {...}}")
        budget = body.get("budget")
        if isinstance(budget, dict) and "day" in budget:
            day = datetime.date.fromisoformat(str(budget["day"]))
            self.spend[record.peer.name] = (day, float(budget.get("usd") or 0.0))  # its word
            for name, (on, usd) in _spend_from_json(budget.get("remembered")).items():
                self._remember_spend(name, on, usd)  # replicas gone before this one came
        record.words = {
            name: word_from_json(data, now)
            for name, data in targets.items()
            if isinstance(data, dict)
        }
        if not record.reachable and record.error is not None:
            log.info("replica %s answers again", record.peer.name)
        record.last_contact, record.reachable, record.error = now, True, None

    def combined(self, name: str) -> Combined:
        runtime = self.runtimes[name]
        return combine(
            own_word(runtime), self.records.values(), name, self.now, self.spec.peer_grace
        )

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
        if self.budget is not None:
            day, usd = self.budget.mine()
            remembered = {
                name: {"day": on.isoformat(), "usd": round(spent, 6)}
                for name, (on, spent) in self.spend.items()
            }
            out["budget"] = {"day": day.isoformat(), "usd": round(usd, 6), "remembered": remembered}
        return out

    def heard_from(self, body: Any) -> None:
        """A report another replica pushed (it holds a request for the first time)."""
        name = body.get("replica") if isinstance(body, dict) else None
        record = self.records.get(str(name)) if name else None
        if record is None and name:
            self._sync_records()  # listed since the last poll
            record = self.records.get(str(name))
        if record is None:
            return  # not listed (yet): the next poll finds it
        with contextlib.suppress(Exception):
            self._heard(record, body)
            self._notify()

    def _push_soon(self) -> None:
        """A request was held here for the first time: tell every other replica now."""
        task = asyncio.get_running_loop().create_task(self._push())
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    async def _push(self) -> None:
        body = self.report()
        await asyncio.gather(
            *(self._post(r.peer, "/replicas/report", body) for r in self.records.values())
        )

    async def _post(self, peer: Peer, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        if self._session is None:
            return None
        try:
            async with self._session.post(peer.url + path, json=body) as resp:
                resp.raise_for_status()
                answer = await resp.json()
                return answer if isinstance(answer, dict) else None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            log.warning("replica %s: POST %s failed: %r", peer.name, path, exc)
            return None

    # -- fencing --------------------------------------------------------------------------

    async def fence_others(self, target: str) -> str | None:
        """Ask every other replica to hold new requests for ``target``: ``None`` when all
        did, else why not (the ones fenced are let go again)."""
        self._sync_records()
        now = self.now
        grace = self.spec.peer_grace
        asked = [r for r in self.records.values() if r.listed or now - r.heard_at < grace]
        body = {"target": target, "leader": self.identity, "seconds": self.spec.fence_timeout}
        fences = (self._post(r.peer, "/replicas/fence", body) for r in asked)
        answers = await asyncio.gather(*fences)
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
        chosen = list(peers) if peers is not None else [r.peer for r in self.records.values()]
        body = {"target": target, "leader": self.identity}
        await asyncio.gather(*(self._post(p, "/replicas/unfence", body) for p in chosen))

    def fence(self, target: str, seconds: float, leader: str) -> str | None:
        fenceable = self.fenceables.get(target)
        if fenceable is None:
            return f"no target {target!r} here"
        if not math.isfinite(seconds):
            return "seconds must be a finite number"
        seconds = min(max(0.0, seconds), self.spec.fence_timeout)  # never longer than ours
        return fenceable.fence(self.now + seconds, leader)

    def unfence(self, target: str) -> None:
        fenceable = self.fenceables.get(target)
        if fenceable is not None:
            fenceable.unfence()

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
            "targets": {name: _combined_json(self.combined(name), now) for name in self.runtimes},
        }


def _spend_from_json(data: Any) -> dict[str, tuple[datetime.date, float]]:
    out: dict[str, tuple[datetime.date, float]] = {}
    if isinstance(data, dict):
        for name, entry in data.items():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                out[str(name)] = (datetime.date.fromisoformat(entry["day"]), float(entry["usd"]))
    return out


def _combined_json(c: Combined, now: float) -> dict[str, Any]:
    return {
        "idle_for": None if c.idle_since is None else round(now - c.idle_since, 3),
        "held": c.held,
        "in_flight": c.in_flight,
        "active_because": c.why_active or None,
    }


# -- the admin endpoints ------------------------------------------------------------------------

REPLICAS = web.AppKey("replicas", Replicas)


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"expected a JSON object: {exc}") from exc
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="expected a JSON object")
    return body


async def view(request: web.Request) -> web.Response:
    return web.json_response(request.app[REPLICAS].describe())


async def activity(request: web.Request) -> web.Response:
    return web.json_response(request.app[REPLICAS].report())


async def fence(request: web.Request) -> web.Response:
    body = await _json_body(request)
    target, leader = str(body.get("target") or ""), str(body.get("leader") or "?")
    try:
        seconds = float(body.get("seconds") or 0)
    except (TypeError, ValueError) as exc:
        raise web.HTTPBadRequest(text="seconds: expected a number") from exc
    refused = request.app[REPLICAS].fence(target, seconds, leader)
    return web.json_response({"fenced": refused is None, "reason": refused})


async def unfence(request: web.Request) -> web.Response:
    body = await _json_body(request)
    request.app[REPLICAS].unfence(str(body.get("target") or ""))
    return web.json_response({"fenced": False})


async def report(request: web.Request) -> web.Response:
    request.app[REPLICAS].heard_from(await _json_body(request))
    return web.json_response({"ok": True})


def add_routes(app: web.Application, replicas: Replicas) -> None:
    app[REPLICAS] = replicas
    app.router.add_get("/replicas", view)
    app.router.add_get("/replicas/activity", activity)
    app.router.add_post("/replicas/fence", fence)
    app.router.add_post("/replicas/unfence", unfence)
    app.router.add_post("/replicas/report", report)
