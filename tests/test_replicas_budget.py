"""The day's cloud budget with two warmgate replicas: what one spends, the other counts. Both
run in this process with the real admin endpoints between them; only who the others are comes
from a static twin of the Lease/EndpointSlice membership (tests/kube covers the real one)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import openai
import pytest

from backends.base import Peer
from backends.specs import ReplicasSpec
from tests.fake_openai import FakeOpenAI
from tests.helpers import metric_value, serve_app, warmgate
from tests.openai_stack import CLOUD_KEY, base_config, cloud_key  # noqa: F401 - a fixture

HELLO = [{"role": "user", "content": "hello"}]


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


async def test_what_one_replica_spends_the_other_counts(
    cloud_key: str,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table: dict[str, str] = {}
    monkeypatch.setattr("router.app.make_membership", lambda spec: StaticMembership(spec, table))
    cloud = FakeOpenAI(api_key=CLOUD_KEY, name="cloud")

    def config(name: str, cloud_url: str) -> dict[str, Any]:
        data = base_config(None, cloud_url, daily_cloud_budget_usd=1.0)
        data["replicas"] = {
            "namespace": "warmgate",
            "service": "warmgate-peers",
            "identity": name,
            "poll_interval": "100ms",
        }
        return data

    async with (
        serve_app(cloud.app()) as cloud_url,
        warmgate(config("warmgate-0", cloud_url)) as a,
        warmgate(config("warmgate-1", cloud_url)) as b,
    ):
        table.update({"warmgate-0": a.admin, "warmgate-1": b.admin})
        client = openai.AsyncOpenAI(base_url=a.url + "/v1", api_key="k", max_retries=0)
        await client.chat.completions.create(model="frontier", messages=HELLO, max_tokens=50)
        await client.close()
        spent_on_a = 1.0 - await metric_value(a.admin, "warmgate_cloud_budget_remaining_usd")
        assert spent_on_a > 0

        async with asyncio.timeout(10):  # b reads a at its next poll
            while True:
                left_on_b = await metric_value(b.admin, "warmgate_cloud_budget_remaining_usd")
                if left_on_b < 1.0:
                    break
                await asyncio.sleep(0.05)
        assert left_on_b == pytest.approx(1.0 - spent_on_a)
