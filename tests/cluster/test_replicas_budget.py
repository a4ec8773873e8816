"""Several warmgate replicas in this process, with the real admin endpoints between them; only
who the others are comes from a static twin of the Lease/EndpointSlice membership (tests/kube
covers the real one): the day's cloud budget is theirs together (and outlives a replica), and a
peer answering nonsense is a silent peer, not the end of reading the others."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import pytest

from backends.membership import Peer
from backends.specs import ReplicasSpec
from tests.fake_openai import FakeOpenAI
from tests.helpers import ROOT, metric_value, serve_app, warmgate
from tests.openai_stack import CLOUD_KEY, base_config, cloud_key  # noqa: F401 - a fixture

HELLO = [{"role": "user", "content": "hello"}]
REPLICAS_TOKEN_FILE = ROOT / "tests" / "replicas-token"
"""The secret the test replicas share (``replicas.token_file``)."""


class StaticMembership:
    """Peers from a shared table (name -> admin URL); the first name leads."""

    def __init__(self, spec: ReplicasSpec, table: dict[str, str]) -> None:
        assert spec.identity is not None
        self._identity = spec.identity
        self.table = table

    @property
    def identity(self) -> str:
        return self._identity

    async def open(self, on_change: Callable[[], None]) -> None: ...

    def peers(self) -> tuple[Peer, ...]:
        return tuple(Peer(n, url) for n, url in sorted(self.table.items()) if n != self._identity)

    def leading(self) -> bool:
        return min(self.table, default=self._identity) == self._identity

    async def confirm(self) -> bool:
        return self.leading()

    def problems(self) -> list[str]:
        return []

    async def close(self) -> None: ...


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Who the replicas are (name -> admin URL), filled in once they listen."""
    peers: dict[str, str] = {}
    monkeypatch.setattr(
        "router.app.make_membership", lambda spec, **_: StaticMembership(spec, peers)
    )
    return peers


def replica_config(name: str, cloud_url: str) -> dict[str, Any]:
    data = base_config(None, cloud_url, daily_cloud_budget_usd=1.0)
    data["replicas"] = {
        "namespace": "warmgate",
        "service": "warmgate-peers",
        "identity": name,
        "poll_interval": "100ms",
        "token_file": str(REPLICAS_TOKEN_FILE),
    }
    return data


async def left(admin: str) -> float:
    return await metric_value(admin, "warmgate_cloud_budget_remaining_usd")


async def until_below(admin: str, value: float) -> float:
    """What the budget has left on that replica, once below ``value`` (it reads the others at
    its next poll)."""
    async with asyncio.timeout(10):
        while True:
            now = await left(admin)
            if now < value:
                return now
            await asyncio.sleep(0.05)


async def until_settled(admin: str, value: float) -> None:
    """Until that replica's budget has ``value`` left: what another replica spent, once it
    settled (while its call runs, a poll may read its reservation, an upper bound)."""
    async with asyncio.timeout(10):
        while True:
            if await left(admin) == pytest.approx(value):
                return
            await asyncio.sleep(0.05)


async def test_what_one_replica_spends_the_other_counts(
    cloud_key: str,  # noqa: F811 - the fixture
    table: dict[str, str],
) -> None:
    cloud = FakeOpenAI(api_key=CLOUD_KEY, name="cloud")
    async with (
        serve_app(cloud.app()) as cloud_url,
        warmgate(replica_config("warmgate-0", cloud_url)) as a,
        warmgate(replica_config("warmgate-1", cloud_url)) as b,
    ):
        table.update({"warmgate-0": a.admin, "warmgate-1": b.admin})
        client = openai.AsyncOpenAI(base_url=a.url + "/v1", api_key="k", max_retries=0)
        await client.chat.completions.create(model="frontier", messages=HELLO, max_tokens=50)
        await client.close()
        spent_on_a = 1.0 - await left(a.admin)
        assert spent_on_a > 0
        await until_settled(b.admin, 1.0 - spent_on_a)


async def test_a_replica_that_comes_later_learns_what_a_gone_one_spent(
    cloud_key: str,  # noqa: F811 - the fixture
    table: dict[str, str],
) -> None:
    cloud = FakeOpenAI(api_key=CLOUD_KEY, name="cloud")
    async with serve_app(cloud.app()) as cloud_url, warmgate(replica_config("b", cloud_url)) as b:
        table["b"] = b.admin
        async with warmgate(replica_config("a", cloud_url)) as a:
            table["a"] = a.admin
            client = openai.AsyncOpenAI(base_url=a.url + "/v1", api_key="k", max_retries=0)
            await client.chat.completions.create(model="frontier", messages=HELLO, max_tokens=50)
            await client.close()
            spent = 1.0 - await left(a.admin)
            await until_settled(b.admin, 1.0 - spent)  # b heard a settle before a goes
        del table["a"]  # a is gone (a rolling update); c replaces it and hears only b
        async with warmgate(replica_config("c", cloud_url)) as c:
            table["c"] = c.admin
            assert await until_below(c.admin, 1.0) == pytest.approx(1.0 - spent)
            assert await left(b.admin) == pytest.approx(1.0 - spent), "not counted twice"


async def test_a_peer_that_answers_nonsense_counts_as_silent_and_reading_goes_on(
    table: dict[str, str],
) -> None:
    from aiohttp import web

    async def nonsense(request: web.Request) -> web.Response:
        return web.json_response({"targets": {"t": {"held": [1], "idle_for": {}}}})

    app = web.Application()
    app.router.add_get("/replicas/activity", nonsense)
    config = {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "targets": {"t": {"routes": [{}], "backend": {"kind": "static", "url": "http://x:1"}}},
        "replicas": {
            "namespace": "w",
            "service": "p",
            "identity": "me",
            "poll_interval": "50ms",
            "token_file": str(REPLICAS_TOKEN_FILE),
        },
    }
    async with serve_app(app) as odd_url, warmgate(config) as wg:
        table.update({"me": wg.admin, "odd": odd_url})
        replicas = wg.server.apps.replicas if wg.server.apps else None
        assert replicas is not None
        async with asyncio.timeout(10):
            while True:
                if "odd" in replicas.records and replicas.records["odd"].error is not None:
                    break
                await asyncio.sleep(0.05)
        first = replicas.records["odd"].first_seen
        await asyncio.sleep(0.3)  # several more rounds: the loop lives on
        view = replicas.describe()
        (odd,) = view["peers"]
        assert odd["reachable"] is False and "held" in odd["error"]
        assert replicas.records["odd"].first_seen == first
        async with aiohttp.ClientSession() as http:
            fence = {"target": "t", "leader": "x", "seconds": float("inf")}
            async with http.post(
                wg.admin + "/replicas/fence",
                data=json.dumps(fence),  # Infinity: Python's json writes and reads it
                headers={
                    "Content-Type": "application/json",
                    "Authorization": "Bearer " + REPLICAS_TOKEN_FILE.read_text().strip(),
                },
            ) as resp:
                answer = await resp.json()
        assert answer == {"fenced": False, "reason": "seconds must be a finite number"}
