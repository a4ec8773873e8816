"""One GPU pool across warmgate replicas: a seat is granted by the leader, so two replicas asked
at once for two targets of a capacity-1 pool never both start one; the other waits, saying
why, and is served once the seat frees. Replicas in this process with the real admin endpoints
between them; who the others are comes from the static membership twin of
tests/cluster/test_replicas_budget.py (tests/kube covers the real one)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from router.scale.state import TargetState
from tests.cluster.test_replicas_budget import REPLICAS_TOKEN_FILE, table  # noqa: F401 - a fixture
from tests.helpers import ROOT, wait_until, warmgate


def engine(prefix: str) -> dict[str, Any]:
    return {
        "routes": [{"path_prefix": prefix, "strip_prefix": True}],
        "pool": "gpu",
        "backend": {
            "kind": "process",
            "command": ["python", "-m", "tests.sleepy_engine", "--port", "{port}", "--load", "0.2"],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"path": "/readyz", "interval": "50ms"},
        "scaling": {"idle_after": "1s", "cold_start_timeout": "60s"},
    }


def replica(name: str) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "pools": {"gpu": {"capacity": 1, "yield_after": "30s"}},
        "targets": {"a": engine("/a"), "b": engine("/b")},
        "replicas": {
            "namespace": "warmgate",
            "service": "warmgate-peers",
            "identity": name,
            "poll_interval": "100ms",
            "peer_grace": "2s",
            "token_file": str(REPLICAS_TOKEN_FILE),
        },
    }


async def test_two_replicas_never_fill_one_seat_and_the_second_is_served_once_it_frees(
    table: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    async with (
        warmgate(replica("warmgate-0")) as leader,
        warmgate(replica("warmgate-1")) as other,
        aiohttp.ClientSession() as session,
    ):
        table.update({"warmgate-0": leader.admin, "warmgate-1": other.admin})
        replicas = other.server.apps.replicas
        await wait_until(lambda: any(r.leader for r in replicas.records.values()))

        runtimes = [wg.runtime(t) for wg in (leader, other) for t in ("a", "b")]
        most = 0
        waited: list[str] = []

        def counted(old: TargetState, new: TargetState) -> None:
            nonlocal most
            most = max(most, sum(1 for rt in runtimes if rt.state.resident))
            if new.waiting_for:
                waited.append(new.waiting_for)

        for runtime in runtimes:
            runtime.cell.subscribe(counted)

        async def get(wg: Any, path: str) -> int:
            async with session.get(wg.url + path) as response:
                await response.read()
                return response.status

        # both asked at once, each replica for another target of the one-seat pool
        first, second = await asyncio.gather(get(leader, "/a/slow?s=0"), get(other, "/b/slow?s=0"))
        assert (first, second) == (200, 200), "the one that waited is served once the seat frees"
        assert most == 1, "never two resident in a pool of capacity 1, over both replicas"
        assert any(w.startswith("waiting for the GPU") for w in waited), waited


async def test_a_request_waiting_for_a_seat_is_served_when_the_leader_goes(
    table: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    async with warmgate(replica("warmgate-1")) as other, aiohttp.ClientSession() as session:
        table["warmgate-1"] = other.admin
        async with warmgate(replica("warmgate-0")) as leader:
            table["warmgate-0"] = leader.admin
            replicas = other.server.apps.replicas
            await wait_until(lambda: any(r.leader for r in replicas.records.values()))
            busy = asyncio.ensure_future(session.get(leader.url + "/a/slow?s=30"))
            await wait_until(lambda: leader.runtime("a").activity.in_flight == 1, timeout=30)
            waiting = asyncio.ensure_future(session.get(other.url + "/b/slow?s=0"))
            await wait_until(lambda: other.runtime("b").state.waiting_for != "", timeout=10)
            assert other.runtime("b").state.phase.value == "cold"
            del table["warmgate-0"]  # the leader goes (a rolling update): warmgate-1 leads
        busy.cancel()
        response = await asyncio.wait_for(waiting, 60)
        assert response.status == 200, "held through the change of leader, then served"
        response.release()
