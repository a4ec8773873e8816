"""Several warmgate replicas, the fast parts: how their words combine (pure), what a lifecycle
that is not the leader does, a fence from the leader and its end, and the Lease election and the
EndpointSlice reading of :class:`KubernetesMembership` against the in-memory API twin on a
fast-forwarded clock. The whole thing, end to end, runs in tests/kube/test_replicas_on_kube.py."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest

from backends.base import Observation
from backends.kubernetes.api import LEASES
from backends.kubernetes.informer import Backoff
from backends.kubernetes.membership import KubernetesMembership, peers_from_slices
from backends.membership import Peer
from backends.outside import Refused
from backends.specs import ReplicasSpec
from router.cluster.combine import PeerRecord, Word, combine, word_from_json, word_to_json
from router.cluster.replicas import Replicas
from router.config import parse_config
from router.errors import ConfigError
from router.scale.lifecycle import Lifecycle
from router.scale.scaling import Act, View, decide
from router.scale.state import Phase, TargetState
from tests.kube.fake import FakeCluster
from tests.rig import Rig
from tests.scale.test_lifecycle import make_rig

GRACE = 30.0


def record(name: str, *, word: Word | None, contact: float | None, reachable: bool) -> PeerRecord:
    r = PeerRecord(Peer(name, f"http://{name}:9090"), first_seen=0.0, last_contact=contact)
    r.reachable = reachable
    if word is not None:
        r.words["t"] = word
    return r


IDLE_OWN = Word(idle_since=100.0)


# -- combining ----------------------------------------------------------------------------------


def test_idle_only_when_every_replica_is_and_since_the_latest() -> None:
    others = [
        record("b", word=Word(idle_since=150.0), contact=200.0, reachable=True),
        record("c", word=Word(idle_since=120.0), contact=200.0, reachable=True),
    ]
    together = combine(IDLE_OWN, others, "t", now=200.0, grace=GRACE)
    assert together.idle_since == 150.0 and together.why_active == ""


def test_one_busy_replica_keeps_the_target_and_sums_count() -> None:
    others = [
        record("b", word=Word(in_flight=2, held=1), contact=200.0, reachable=True),
        record("c", word=Word(idle_since=120.0, held=0), contact=200.0, reachable=True),
    ]
    together = combine(IDLE_OWN, others, "t", now=200.0, grace=GRACE)
    assert together.idle_since is None
    assert (together.held, together.in_flight) == (1, 2)
    assert "replica b is active" in together.why_active


def test_a_silent_replica_counts_as_active_until_its_grace_runs_out() -> None:
    silent = record("b", word=Word(idle_since=50.0), contact=190.0, reachable=False)
    within = combine(IDLE_OWN, [silent], "t", now=200.0, grace=GRACE)
    assert within.idle_since is None and "not answering" in within.why_active
    past = combine(IDLE_OWN, [silent], "t", now=190.0 + GRACE + 1, grace=GRACE)
    assert past.idle_since == 100.0, "past its grace, its last word (idle since 50) stands"


def test_a_replica_gone_while_active_counts_as_idle_only_from_when_it_was_last_heard() -> None:
    gone = record("b", word=Word(in_flight=1), contact=190.0, reachable=False)
    past = combine(IDLE_OWN, [gone], "t", now=190.0 + GRACE + 1, grace=GRACE)
    assert past.idle_since == 190.0


def test_a_replica_never_heard_counts_as_active_from_when_it_was_listed() -> None:
    never = record("b", word=None, contact=None, reachable=False)
    never.first_seen = 180.0
    assert combine(IDLE_OWN, [never], "t", now=200.0, grace=GRACE).idle_since is None
    late = combine(IDLE_OWN, [never], "t", now=180.0 + GRACE + 1, grace=GRACE)
    assert late.idle_since == 180.0


def test_an_active_replica_here_wins_over_idle_others() -> None:
    others = [record("b", word=Word(idle_since=10.0), contact=200.0, reachable=True)]
    together = combine(Word(in_flight=1), others, "t", now=200.0, grace=GRACE)
    assert together.idle_since is None and together.why_active == "this replica is active"


def test_words_travel_as_times_relative_to_the_sender_and_receiver() -> None:
    word = Word(held=1, in_flight=2, idle_since=90.0, wanted_until=130.0, phase="ready")
    data = word_to_json(word, now=100.0)
    assert data == {
        "phase": "ready",
        "held": 1,
        "in_flight": 2,
        "idle_for": 10.0,
        "wanted_for": 30.0,
    }
    back = word_from_json(data, now=5000.0)  # another loop clock entirely
    assert back == Word(held=1, in_flight=2, idle_since=4990.0, wanted_until=5030.0, phase="ready")
    assert word_from_json({"idle_for": None}, 1.0).idle_since is None
    assert word_from_json({}, 1.0).wanted_until == -math.inf


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("idle_for", 1e400),  # what json reads for 1e400: an infinity
        ("idle_for", math.nan),
        ("idle_for", 10**400),
        ("idle_for", -5.0),
        ("idle_for", True),
        ("wanted_for", math.inf),
        ("wanted_for", 10**400),
        ("held", 10**400),
        ("held", 1.5),
        ("in_flight", -1),
        ("in_flight", True),
    ],
)
def test_a_number_out_of_its_bounds_in_a_replicas_word_is_no_answer(
    field: str, value: object
) -> None:
    with pytest.raises(Refused) as refused:
        word_from_json({"phase": "ready", field: value}, now=100.0)
    assert refused.value.field == field and isinstance(refused.value, ValueError)


# -- deciding -----------------------------------------------------------------------------------


def _view(**kwargs: Any) -> View:
    config = parse_config(
        {
            "targets": {
                "t": {
                    "routes": [{}],
                    "backend": {"kind": "process", "command": ["x"]},
                    "scaling": {"idle_after": "10s"},
                }
            }
        }
    )
    defaults: dict[str, Any] = {
        "state": TargetState(Phase.READY, 0.0, endpoints=("http://a",)),
        "observation": Observation(running=True, endpoints=("http://a",)),
        "scaling": config.targets["t"].scaling,
        "now": 100.0,
        "idle_since": 50.0,
    }
    return View(**{**defaults, **kwargs})


def test_only_a_replica_that_may_release_drains() -> None:
    assert decide(_view()).act is Act.DRAIN
    assert decide(_view(may_release=False)).act is Act.WAIT
    put_off = decide(_view(release_not_before=103.0))
    assert (put_off.act, put_off.until) == (Act.WAIT, 103.0)


def test_a_fenced_replica_waits_for_the_release_then_serves_again() -> None:
    draining = TargetState(Phase.DRAINING, 90.0, endpoints=("http://a",), stopping=True)
    waiting = decide(_view(state=draining, fenced_until=105.0))
    assert (waiting.act, waiting.until) == (Act.WAIT, 105.0)
    assert decide(_view(state=draining, fenced_until=99.0)).act is Act.RESUME
    gone = decide(_view(state=draining, fenced_until=105.0, observation=Observation()))
    assert gone.act is Act.LOST, "the leader's release shows: cold"


# -- a fence, on a lifecycle ----------------------------------------------------------------------


class NotLeading:
    """A Membership twin for a replica that is not the leader, with no one else listed."""

    identity = "warmgate-1"

    async def open(self, on_change: Any) -> None: ...

    def peers(self) -> tuple[Peer, ...]:
        return ()

    def leading(self) -> bool:
        return False

    async def confirm(self) -> bool:
        return False

    def problems(self) -> list[str]:
        return []

    async def close(self) -> None: ...


@contextlib.asynccontextmanager
async def ready_rig(membership: Any = None) -> AsyncIterator[Rig]:
    """A target on a replica (by default not the leader), ready, idle window 60 s."""
    rig = make_rig(idle_after="60s")
    replicas = Replicas(membership or NotLeading(), spec(), {"t": rig.runtime}, rig.metrics)
    rig.lifecycle = Lifecycle(rig.runtime, replicas)
    await rig.lifecycle.open()
    try:
        await rig.serve(0.1)
        assert rig.phase is Phase.READY
        yield rig
    finally:
        await rig.lifecycle.close()


class Leading(NotLeading):
    identity = "warmgate-0"

    def leading(self) -> bool:
        return True

    async def confirm(self) -> bool:
        return True


@pytest.mark.looptime
async def test_a_replica_that_is_not_the_leader_never_releases() -> None:
    async with ready_rig() as rig:
        await asyncio.sleep(3600)
        assert rig.phase is Phase.READY and rig.backend.calls == ["up"]


@pytest.mark.looptime
async def test_a_fence_is_refused_while_this_replica_is_active_or_not_idle_long_enough() -> None:
    async with ready_rig() as rig:
        loop = asyncio.get_running_loop()
        busy = rig.serve(5)
        await asyncio.sleep(1)
        assert rig.lifecycle.fence(loop.time() + 10, "leader") == "active here"
        await busy
        assert "idle for only" in (rig.lifecycle.fence(loop.time() + 10, "leader") or "")
        assert rig.phase is Phase.READY


@pytest.mark.looptime
async def test_a_fenced_replica_holds_new_requests_until_the_release_then_wakes_it_again() -> None:
    async with ready_rig() as rig:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(61)
        assert rig.lifecycle.fence(loop.time() + 10, "warmgate-0") is None
        assert rig.phase is Phase.DRAINING and rig.runtime.state.stopping
        held = rig.serve(0.1)  # arrives between the fence and the release
        await asyncio.sleep(1)
        assert not held.done(), "held: the pod may be stopped any moment"
        rig.backend.set(Observation())  # the leader's scale-down shows in the cluster
        assert await held >= 1, "cold, then started again for the held request"
        assert rig.phase is Phase.READY
        assert rig.backend.calls == ["up", "up"], "this replica never scaled down"
        assert rig.metric("warmgate_idle_releases_total") == 0, "counted by the leader"


@pytest.mark.looptime
async def test_a_fence_that_the_leader_calls_off_or_that_runs_out_serves_again() -> None:
    async with ready_rig() as rig:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(61)
        assert rig.lifecycle.fence(loop.time() + 10, "warmgate-0") is None
        held = rig.serve(0.1)
        await asyncio.sleep(1)
        rig.lifecycle.unfence()  # another replica refused: the leader calls it off
        assert rig.phase is Phase.READY
        assert await held < 2
        await asyncio.sleep(61)
        assert rig.lifecycle.fence(loop.time() + 10, "warmgate-0") is None
        began = loop.time()
        await rig.until(Phase.READY)  # the leader died before releasing: the fence runs out
        assert 9 <= loop.time() - began <= 11
        assert rig.backend.calls == ["up"]


@pytest.mark.looptime
async def test_a_fence_that_ends_with_the_pod_gone_waits_for_one_instead_of_serving_none() -> None:
    async with ready_rig() as rig:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(61)
        assert rig.lifecycle.fence(loop.time() + 10, "warmgate-0") is None
        rig.backend.set(Observation(running=True))  # the pod restarts meanwhile: no endpoint
        await asyncio.sleep(11)
        assert rig.phase is Phase.STARTING and rig.runtime.state.endpoints == ()
        rig.backend.set(Observation(running=True, endpoints=(rig.backend.endpoint,)))
        await rig.until(Phase.READY)
        assert rig.runtime.state.endpoints == (rig.backend.endpoint,)
        assert rig.runtime.state.stopping is False


@pytest.mark.looptime
async def test_with_replicas_a_failed_start_leaves_the_workload_then_idleness_releases_it() -> None:
    async with ready_rig(Leading()) as rig:
        phases: list[tuple[Phase, list[str]]] = []
        rig.runtime.cell.subscribe(
            lambda old, new: phases.append((new.phase, list(rig.backend.calls)))
        )
        rig.backend.crash("the pod restarted")  # lost while ready: cold, left alone
        await asyncio.sleep(1)
        rig.backend.set(Observation(running=True))  # running again, never ready from here
        await rig.until(Phase.STARTING)
        await asyncio.sleep(30)
        assert rig.backend.calls == ["up"] and rig.phase is Phase.STARTING
        await rig.until(Phase.COLD, limit=400)  # failed, then idle everywhere: released
        assert (Phase.FAILED, ["up"]) in phases, "a failed start here stopped nothing"
        assert rig.backend.calls == ["up", "down"]
        assert rig.metric("warmgate_idle_releases_total") == 1


# -- the Lease and the EndpointSlices -----------------------------------------------------------


def spec(**overrides: Any) -> ReplicasSpec:
    values: dict[str, Any] = {
        "namespace": "warmgate",
        "service": "warmgate-peers",
        "lease_duration": 15,
        "renew_interval": 5,
        **overrides,
    }
    return ReplicasSpec(**values)


def member(cluster: FakeCluster, name: str) -> KubernetesMembership:
    async def connect() -> Any:
        return cluster.client()

    return KubernetesMembership(
        spec(), connect=connect, identity=name, own_address="", backoff=Backoff(0.1, 1.0, 0.0)
    )


@pytest.mark.looptime
async def test_one_replica_leads_another_takes_over_on_release_or_after_expiry() -> None:
    cluster = FakeCluster()
    a, b, c = member(cluster, "a"), member(cluster, "b"), member(cluster, "c")
    changes: list[str] = []
    for m in (a, b, c):
        await m.open(lambda m=m: changes.append(m.identity))  # type: ignore[misc]
    try:
        assert [m.leading() for m in (a, b, c)] == [True, False, False]
        await asyncio.sleep(60)  # renewed all along
        assert [m.leading() for m in (a, b, c)] == [True, False, False]
        assert await a.confirm() and not await b.confirm()

        await a.close()  # a clean stop hands the Lease over at once
        await asyncio.sleep(5.5)
        assert sorted(m.leading() for m in (b, c)) == [False, True]
        leader, other = (b, c) if b.leading() else (c, b)
        lease = await cluster.client().get(LEASES, "warmgate", "warmgate-leader")
        assert lease["spec"]["holderIdentity"] == leader.identity
        assert lease["spec"]["leaseTransitions"] == 1

        for task in list(leader._tasks):  # the leader dies: no renewal, no hand-over
            task.cancel()
        for _ in range(120):  # never two leaders at one instant, and the Lease moves on
            assert not (leader.leading() and other.leading())
            await asyncio.sleep(0.25)
        assert other.leading() and not leader.leading()
        assert changes.count(other.identity) >= 1, "told of the change"
    finally:
        for m in (b, c):
            await m.close()


@pytest.mark.looptime
async def test_an_api_server_away_at_start_leaves_the_replica_degraded_then_leading() -> None:
    cluster = FakeCluster()
    cluster.go_down()
    a = member(cluster, "a")
    await a.open(lambda: None)
    try:
        assert not a.leading()
        assert any("unreachable" in p for p in a.problems())
        cluster.come_back()
        await asyncio.sleep(15)
        assert a.leading() and a.problems() == []
    finally:
        await a.close()


def _slice(name: str, port: Any, *endpoints: tuple[str, str | None]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "addressType": "IPv4",
        "ports": [{"name": "admin", "port": 9090}, {"name": "http", "port": 8080}],
        "endpoints": [
            {
                "addresses": [address],
                **({"targetRef": {"kind": "Pod", "name": pod}} if pod else {}),
                "conditions": {"ready": False},
            }
            for address, pod in endpoints
        ],
    } | ({"ports": port} if port is not None else {})


def test_peers_are_the_service_endpoints_but_this_one_ready_or_not() -> None:
    slices = [
        _slice("a", None, ("10.0.0.1", "warmgate-0"), ("10.0.0.2", "warmgate-1")),
        _slice("b", None, ("fd00::3", "warmgate-2"), ("10.0.0.4", None)),
        {"metadata": {"name": "fqdn"}, "addressType": "FQDN", "endpoints": [{"addresses": ["x"]}]},
    ]
    peers, problems = peers_from_slices(slices, "admin", "warmgate-1")
    assert peers == (
        Peer("10.0.0.4", "http://10.0.0.4:9090"),
        Peer("warmgate-0", "http://10.0.0.1:9090"),
        Peer("warmgate-2", "http://[fd00::3]:9090"),
    )
    assert problems == []
    by_number, _ = peers_from_slices(slices, 8080, "warmgate-1", own_address="10.0.0.4")
    assert [p.url for p in by_number] == ["http://10.0.0.1:8080", "http://[fd00::3]:8080"]
    _, problems = peers_from_slices([_slice("c", [], ("10.0.0.5", "x"))], "admin", "me")
    assert problems == ["EndpointSlice c has no port 'admin'"]


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        ({"service": "warmgate-peers"}, "replicas.namespace"),
        ({"namespace": "Warm_Gate", "service": "p"}, "expected a DNS label"),
        (
            {"namespace": "w", "service": "p", "lease_duration": "10s", "renew_interval": "6s"},
            "at most half of lease_duration",
        ),
        ({"namespace": "w", "service": "p", "poll_interval": "soon"}, "replicas.poll_interval"),
    ],
)
def test_a_bad_replicas_block_names_the_key(replicas: dict[str, Any], expected: str) -> None:
    config = {
        "targets": {"t": {"routes": [{}], "backend": {"kind": "static", "url": "http://x:1"}}},
        "replicas": replicas,
    }
    with pytest.raises(ConfigError) as err:
        parse_config(config, "warmgate.yaml")
    assert expected in str(err.value) and "warmgate.yaml" in str(err.value)
