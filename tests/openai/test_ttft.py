"""Time to first token per model, measured on the API path (router/openai/ttft.py): a local
answer, streamed and not, and a cloud answer; ``/status``'s ``ttft`` per model (p50/p95 over
the window, local and cloud apart), the dashboard and ``warmgate status`` show it; the cloud's
spend is told per model, as a line over the day."""

from __future__ import annotations

import io

import aiohttp
import pytest

from router.openai.ttft import FirstTokens, percentile
from router.status import render
from tests.fake_openai import FakeOpenAI
from tests.helpers import metric_value
from tests.openai_stack import cloud_key, stack

__all__ = ["cloud_key"]
pytestmark = pytest.mark.usefixtures("cloud_key")

HELLO = [{"role": "user", "content": "hello there"}]


def test_percentiles_are_nearest_rank_over_the_window() -> None:
    now = [0.0]
    tokens = FirstTokens(lambda: now[0])
    assert tokens.describe("m") is None
    for seconds in (0.1, 0.2, 0.3, 0.4, 5.0):
        tokens.record("m", "local", seconds)
    assert tokens.describe("m") == {"local": {"p50": 0.3, "p95": 5.0, "n": 5}}
    assert percentile([1.0], 0.95) == 1.0
    now[0] = 25 * 3600.0
    assert tokens.describe("m") is None, "what is older than the window no longer counts"


async def status(admin: str) -> dict:  # type: ignore[type-arg]
    async with aiohttp.ClientSession() as session, session.get(admin + "/status") as response:
        return await response.json()  # type: ignore[no-any-return]


async def test_ttft_is_measured_local_and_cloud_and_shown() -> None:
    local = FakeOpenAI(name="local", chunk_delay=0.05)
    async with stack(local=local) as st:
        client = st.client()
        assert (await status(st.wg.admin))["api"]["models"]["qwen3-8b"]["ttft"] is None
        await client.chat.completions.create(model="qwen3-8b", messages=HELLO)
        stream = await client.chat.completions.create(model="qwen3-8b", messages=HELLO, stream=True)
        async for _ in stream:
            pass
        await client.chat.completions.create(model="frontier", messages=HELLO)
        await client.close()

        view = await status(st.wg.admin)
        models = view["api"]["models"]
        local_ttft = models["qwen3-8b"]["ttft"]
        assert set(local_ttft) == {"local"} and local_ttft["local"]["n"] == 2
        assert 0 < local_ttft["local"]["p50"] <= local_ttft["local"]["p95"]
        cloud_ttft = models["frontier"]["ttft"]
        assert set(cloud_ttft) == {"cloud"} and cloud_ttft["cloud"]["n"] == 1
        assert models["local-only"]["ttft"] is None

        spent = view["api"]["spend_today_by_model"]
        assert set(spent) == {"frontier"} and spent["frontier"] > 0
        line = view["api"]["spend_line_by_model"]["frontier"]
        assert len(line) == 1 and line[0][1] == pytest.approx(spent["frontier"])

        async with aiohttp.ClientSession() as session, session.get(st.wg.admin) as response:
            page = await response.text()
        assert 'class="ttft-local">local p50' in page and "(2 answers)" in page
        assert 'class="spend" data-model="frontier"' in page

        out = io.StringIO()
        render(view, out)
        text = out.getvalue()
        assert "TTFT P50/P95" in text
        p50, p95 = local_ttft["local"]["p50"], local_ttft["local"]["p95"]
        assert f"local {p50:.2f}/{p95:.2f}s" in text

        count = await metric_value(st.wg.admin, "warmgate_ttft_seconds_count", model="qwen3-8b")
        assert count == 2
