"""engine: openai against a real llama.cpp server (llama-cpp-python[server], built from its
sdist into a venv outside the clone by ``make llama``), serving a tiny GGUF this test writes:
the cold start warmgate holds a streamed completion through, the stream through the API
policy, the model lists, and the idle release. Figures: cold start and time to first token,
through warmgate and straight to the server."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from router.scale.state import Phase
from tests.engines.tiny_gguf import write_tiny_llama
from tests.helpers import wait_until, warmgate

VENV = Path(os.environ.get("WARMGATE_LLAMA_VENV", "/var/cache/warmgate-llama"))
PYTHON = VENV / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not (VENV / ".installed").exists(),
    reason=f"llama-cpp-python[server] is not built in {VENV} (make llama builds it)",
)

ALIAS = "tiny"
ASK: dict[str, Any] = {
    "messages": [{"role": "user", "content": "the gate"}],
    "max_tokens": 12,
    "temperature": 0.0,
    "logit_bias": {"2": -100},  # never the end of text: every stream carries its 12 tokens
}


def server_command(model: Path, port: str) -> list[str]:
    return [
        str(PYTHON), "-m", "llama_cpp.server", "--model", str(model), "--model_alias", ALIAS,
        "--host", "127.0.0.1", "--port", port, "--n_ctx", "512", "--n_threads", "2",
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def first_token(client: openai.AsyncOpenAI) -> tuple[float, int, dict[str, str]]:
    """Stream one chat completion: seconds to its first content token, the chunks, headers."""
    started = time.monotonic()
    first: float | None = None
    chunks = 0
    async with client.chat.completions.with_streaming_response.create(
        model=ALIAS, stream=True, **ASK
    ) as response:
        headers = dict(response.headers)
        async for chunk in await response.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                chunks += 1
                if first is None:
                    first = time.monotonic() - started
    assert first is not None, "no token came"
    return first, chunks, headers


async def direct(model: Path) -> tuple[float, float, float]:
    """The server on its own: seconds from its start to /v1/models answering, and to the first
    token of its first streamed completion once ready, and of its second."""
    port = free_port()
    started = time.monotonic()
    command = server_command(model, str(port))
    process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.DEVNULL)
    try:
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/v1/models") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert process.returncode is None, "llama.cpp's server exited"
                await asyncio.sleep(0.05)
        cold = time.monotonic() - started
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        first, _, _ = await first_token(client)
        second, _, _ = await first_token(client)
        await client.close()
        return cold, first, second
    finally:
        process.terminate()
        await process.wait()


def config(model: Path) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {
            "llama": {
                "engine": "openai",
                "routes": [{"path_prefix": "/llama", "strip_prefix": True}],
                "backend": {
                    "kind": "process",
                    "command": server_command(model, "{port}"),
                    "stop_grace": "5s",
                },
                "readiness": {"interval": "50ms"},
                "scaling": {"idle_after": "3s", "cold_start_timeout": "120s"},
            }
        },
        "models": {ALIAS: {"placements": [{"target": "llama", "model": ALIAS}]}},
        "api": {"allow_anonymous": True},
    }


async def test_llama_cpp_cold_start_stream_models_and_release(
    tmp_path: Path, record_property: Any
) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    cold_direct, ttft_direct_first, ttft_direct = await direct(model)

    async with warmgate(config(model)) as wg:
        runtime = wg.runtime("llama")
        client = openai.AsyncOpenAI(base_url=wg.url + "/v1", api_key="none", timeout=180)
        assert runtime.state.phase is Phase.COLD
        # Held through the cold start, then streamed through the policy as it comes.
        ttft_cold, chunks, headers = await first_token(client)
        assert chunks >= 2, "streamed, not one buffered answer"
        held = float(headers["x-warmgate-cold-start"])
        assert "llama" in headers["x-warmgate-decision"]
        ttft_warm, _, warm_headers = await first_token(client)
        assert "x-warmgate-cold-start" not in warm_headers

        listed = await client.models.list()
        assert ALIAS in [m.id for m in listed.data]
        async with aiohttp.ClientSession() as http, http.get(wg.url + "/llama/v1/models") as r:
            assert r.status == 200  # the server's own list, a read: served, woke nothing
            assert ALIAS in [m["id"] for m in (await r.json())["data"]]
        await client.close()

        await wait_until(lambda: runtime.state.phase is Phase.COLD, timeout=30)
        assert runtime.state.reason.startswith("idle for")

    figures = {
        "cold_start_direct_s": cold_direct,
        "cold_start_held_s": held,
        "ttft_direct_first_s": ttft_direct_first,
        "ttft_direct_s": ttft_direct,
        "ttft_warm_through_warmgate_s": ttft_warm,
        "ttft_cold_through_warmgate_s": ttft_cold,
    }
    for name, value in figures.items():
        record_property(name, round(value, 3))
    print("\n" + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))
