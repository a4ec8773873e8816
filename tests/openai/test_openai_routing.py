"""Placement end to end: a local target that cold-starts for real (a process), the cloud through
the SDK, privacy, the money budget under concurrency, warming, and falling back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest

from router.scale.state import Phase
from tests.fake_openai import FakeOpenAI
from tests.helpers import wait_until
from tests.openai_stack import CLOUD_KEY, Stack, cloud_key, process_target, stack

__all__ = ["cloud_key"]
pytestmark = pytest.mark.usefixtures("cloud_key")

HELLO = [{"role": "user", "content": "hello there"}]


def cold_local(config: dict[str, Any], **kwargs: Any) -> None:
    config["targets"]["vllm-local"] = process_target(**kwargs)


def phase(st: Stack) -> Phase:
    return st.wg.runtime("vllm-local").state.phase  # type: ignore[no-any-return]


async def test_cold_local_and_short_budget_go_to_the_cloud_and_warm_the_target() -> None:
    async with stack(tweak=cold_local) as st:
        assert phase(st) is Phase.COLD
        client = st.client()
        raw = await client.chat.completions.with_raw_response.create(
            model="qwen3-8b", messages=HELLO, extra_headers={"X-Warmgate-Max-Wait": "1s"}
        )
        assert raw.headers["x-warmgate-decision"] == "managed/frontier-large; reason=local_cold"
        assert st.cloud.count("/v1/chat/completions") == 1
        await wait_until(lambda: phase(st) is Phase.READY, timeout=20)
        raw = await client.chat.completions.with_raw_response.create(
            model="qwen3-8b", messages=HELLO, extra_headers={"X-Warmgate-Max-Wait": "1s"}
        )
        assert raw.headers["x-warmgate-decision"] == "vllm-local; reason=ready"
        assert st.cloud.count("/v1/chat/completions") == 1
        learned = st.wg.runtime("vllm-local").learned
        assert learned.cold_starts.history  # learned for the next prediction
        await client.close()


async def test_without_warm_on_cloud_the_target_stays_cold() -> None:
    async with stack(tweak=cold_local, warm_on_cloud=False) as st:
        client = st.client()
        await client.chat.completions.create(model="qwen3-8b", messages=HELLO)
        await asyncio.sleep(0.3)
        assert phase(st) is Phase.COLD
        await client.close()


async def test_a_generous_latency_budget_holds_through_the_cold_start() -> None:
    async with stack(tweak=cold_local) as st:
        client = st.client()
        stream = await client.chat.completions.with_raw_response.create(
            model="qwen3-8b",
            messages=HELLO,
            stream=True,
            extra_headers={"X-Warmgate-Max-Wait": "60s"},
        )
        assert stream.headers["x-warmgate-decision"] == "vllm-local; reason=cold_within_budget"
        assert float(stream.headers["x-warmgate-cold-start"]) > 0.2
        text = "".join([c.choices[0].delta.content or "" async for c in stream.parse()])
        assert text == "Hello from the fake server ."
        assert st.cloud.requests == []
        await client.close()


async def test_private_work_never_reaches_the_cloud(tmp_path: Path) -> None:
    (tmp_path / "keys.txt").write_text("lab-private sk-lab-1\nteam sk-team-2\n")

    def tweak(config: dict[str, Any]) -> None:
        cold_local(config, startup_delay=0.3)
        config["api"] = {"api_keys_file": "keys.txt"}
        config["policy"]["private"] = {"header": "X-Warmgate-Private", "api_keys": ["lab-private"]}

    async with stack(tweak=tweak, base_dir=str(tmp_path), daily_cloud_budget_usd=1e6) as st:
        team, lab = st.client(key="sk-team-2"), st.client(key="sk-lab-1")
        tiny = {"X-Warmgate-Max-Wait": "1ms"}
        cases: list[tuple[openai.AsyncOpenAI, dict[str, str]]] = [
            (team, {**tiny, "X-Warmgate-Private": "1"}),
            (team, {**tiny, "X-Warmgate-Private": "maybe"}),  # not plainly false: private
            (team, {**tiny, "X-Warmgate-Private": ""}),
            (lab, tiny),
        ]
        for client, headers in cases:
            with pytest.raises(openai.InternalServerError) as info:
                await client.chat.completions.create(
                    model="qwen3-8b", messages=HELLO, extra_headers=headers
                )
            assert info.value.status_code == 503
            assert "never leaves the building" in info.value.message
            decision = info.value.response.headers["x-warmgate-decision"]
            assert decision == "none; reason=private_local_late"
            with pytest.raises(openai.InternalServerError):  # a cloud-only model: refused
                await client.chat.completions.create(
                    model="frontier", messages=HELLO, extra_headers=headers
                )
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(
                    model="frontier", messages=HELLO, stream=True, extra_headers=headers
                )
        assert st.cloud.requests == []
        # the refused private requests started the local target: private work runs there
        await wait_until(lambda: phase(st) is Phase.READY, timeout=20)
        answer = await lab.chat.completions.create(
            model="qwen3-8b", messages=HELLO, extra_headers=tiny
        )
        assert answer.choices[0].message.content
        # and a plainly non-private request may still use the cloud
        await team.chat.completions.create(
            model="frontier", messages=HELLO, extra_headers={"X-Warmgate-Private": "false"}
        )
        assert st.cloud.count("/v1/chat/completions") == 1
        assert CLOUD_KEY not in str(st.cloud.requests[0].json())
        await team.close()
        await lab.close()


async def test_a_private_request_may_hold_for_the_local_target() -> None:
    async with stack(tweak=cold_local, daily_cloud_budget_usd=1e6) as st:
        client = st.client()
        raw = await client.chat.completions.with_raw_response.create(
            model="qwen3-8b",
            messages=HELLO,
            extra_headers={"X-Warmgate-Private": "yes", "X-Warmgate-Max-Wait": "2m"},
        )
        assert raw.headers["x-warmgate-decision"] == "vllm-local; reason=cold_within_budget"
        assert st.cloud.requests == []
        await client.close()


async def test_concurrent_requests_cannot_overspend_the_day() -> None:
    cloud = FakeOpenAI(api_key=CLOUD_KEY, name="cloud", delay=0.5)
    body = {"model": "frontier", "messages": HELLO, "max_tokens": 6}
    async with stack(cloud=cloud) as st:
        from router.openai.costs import estimate

        price = st.wg.server.config.models["frontier"].placements[0].cost
        one = estimate("chat", body, price, 1024)
        st.api.budget.limit = 10 * one  # a budget for ten requests
        client = st.client(max_retries=2)  # warmgate's 429 must not make it loop

        async def ask() -> str:
            try:
                await client.chat.completions.create(model="frontier", messages=HELLO, max_tokens=6)
            except openai.RateLimitError as exc:
                assert exc.response.headers["x-should-retry"] == "false"
                assert exc.code == "cloud_budget_exhausted"
                return "429"
            return "ok"

        results = await asyncio.gather(*(ask() for _ in range(100)))
        assert results.count("ok") == 10 and results.count("429") == 90
        assert st.cloud.count("/v1/chat/completions") == 10
        assert st.api.budget.spent <= st.api.budget.limit
        assert st.api.budget.reserved == 0.0
        assert await st.decisions(model="frontier") == 100  # one decision each: no retries
        await client.close()


async def test_a_cloud_failure_falls_back_to_the_local_target() -> None:
    local = FakeOpenAI(name="local", chunk_delay=0.3)
    async with stack(local=local, overflow_queue_depth=0) as st:
        client = st.client()
        busy = await client.chat.completions.create(model="qwen3-8b", messages=HELLO, stream=True)
        first = await busy.__anext__()  # the local target now has one request in progress
        assert first.choices
        st.cloud.fail_next(503, times=2)
        raw = await client.chat.completions.with_raw_response.create(
            model="qwen3-8b", messages=HELLO
        )
        assert raw.headers["x-warmgate-decision"] == "vllm-local; reason=busy_cloud_failed"
        assert raw.parse().choices[0].message.content
        assert st.cloud.count("/v1/chat/completions") == 2
        assert await st.decisions(model="qwen3-8b", reason="local_busy") == 1
        async for _ in busy:
            pass
        # private work on a saturated target stays local without asking the cloud
        raw = await client.chat.completions.with_raw_response.create(
            model="qwen3-8b", messages=HELLO, extra_headers={"X-Warmgate-Private": "1"}
        )
        assert raw.headers["x-warmgate-decision"] == "vllm-local; reason=ready"
        await client.close()


async def test_a_spent_budget_holds_for_local_instead_of_refusing() -> None:
    async with stack(tweak=cold_local, daily_cloud_budget_usd=0) as st:
        client = st.client()
        raw = await client.chat.completions.with_raw_response.create(
            model="qwen3-8b", messages=HELLO, extra_headers={"X-Warmgate-Max-Wait": "0"}
        )
        assert raw.headers["x-warmgate-decision"] == "vllm-local; reason=budget_exhausted"
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="frontier", messages=HELLO)
        assert st.cloud.requests == []
        await client.close()
