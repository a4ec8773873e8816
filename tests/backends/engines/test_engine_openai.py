"""engine: openai, end to end: a local OpenAI-compatible server (tests/openai_server.py) run by
the process backend behind warmgate, called with the real openai client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from openai import AsyncOpenAI

from router.scale.state import Phase
from tests.helpers import ROOT, Running, one_target, wait_until, warmgate


def openai_config(**target: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "engine": "openai",
        "routes": [{"path_prefix": "/v1"}],
        "backend": {
            "kind": "process",
            "command": ["python", "-m", "tests.openai_server", "--port", "{port}"],
            "cwd": str(ROOT),
            "stop_grace": "5s",
        },
        "readiness": {"interval": "50ms"},
        "scaling": {"idle_after": "1s", "stream_activity_window": "200ms"},
    }
    return one_target("llm", spec, **target)


def phase(wg: Running) -> Phase:
    return wg.runtime("llm").state.phase  # type: ignore[no-any-return]


async def stats(wg: Running) -> dict[str, int]:
    endpoint = wg.runtime("llm").state.endpoints[0]
    async with aiohttp.ClientSession() as http, http.get(endpoint + "/stats") as r:
        return await r.json()  # type: ignore[no-any-return]


async def test_readiness_is_v1_models_and_costs_no_completion(tmp_path: Path) -> None:
    config = openai_config(scaling={"idle_after": "30s"})
    async with warmgate(config, str(tmp_path)) as wg:
        async with aiohttp.ClientSession() as http, http.get(wg.url + "/v1/models") as r:
            # Listing models (dashboards poll it) does not wake a cold GPU.
            assert r.status == 503 and (await r.json())["error"]["code"] == "target_cold"
        assert phase(wg) is Phase.COLD
        client = AsyncOpenAI(base_url=wg.url + "/v1", api_key="unused", max_retries=0)
        async with client:
            reply = await client.chat.completions.with_raw_response.create(
                model="local-qwen", messages=[{"role": "user", "content": "hi"}]
            )
            assert reply.headers.get("X-Warmgate-Cold-Start")
            assert reply.parse().choices[0].message.content == "warm gate says hello"
        counts = await stats(wg)
        # Probed through /v1/models until the weights were loaded (503 meanwhile); the only
        # completion is the user's, and none was refused.
        assert counts["models"] >= 2 and counts["completions"] == 1
        assert "refused" not in counts


async def test_a_slow_streamed_completion_keeps_the_target(tmp_path: Path) -> None:
    async with warmgate(openai_config(), str(tmp_path)) as wg:
        client = AsyncOpenAI(base_url=wg.url + "/v1", api_key="unused", max_retries=0)
        async with client:
            stream = await client.chat.completions.create(
                model="local-qwen",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                extra_body={"token_gap": 1.5},  # silent for 1.5 s at a time; idle_after is 1 s
            )
            words = []
            async for chunk in stream:
                assert phase(wg) is Phase.READY
                words.append(chunk.choices[0].delta.content or "")
            assert "".join(words).split() == ["warm", "gate", "says", "hello"]
        await asyncio.sleep(0.5)
        assert phase(wg) is Phase.READY
        await wait_until(lambda: phase(wg) is Phase.COLD, timeout=5)
