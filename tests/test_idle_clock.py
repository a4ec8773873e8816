"""The idle clock as /targets shows it: no ``idle_seconds`` while a target is cold or starting
(nothing to be idle yet)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.helpers import ROOT, static_config, warmgate


async def targets(admin: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(admin + "/targets") as resp:
        body: dict[str, Any] = await resp.json()
        return body


async def test_no_idle_seconds_while_a_target_is_starting() -> None:
    sleepy = {
        "routes": [{"path_prefix": "/"}],
        "backend": {
            "kind": "process",
            "command": ["python", "-m", "tests.sleepy_engine", "--port", "{port}", "--load", "30"],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"path": "/readyz", "interval": "50ms"},
    }
    config = static_config("http://127.0.0.1:9")
    config["targets"] = {"sleepy": sleepy}
    async with warmgate(config) as wg, aiohttp.ClientSession() as http:
        cold = (await targets(wg.admin))["sleepy"]
        assert cold["phase"] == "cold" and cold["idle_seconds"] is None
        held = asyncio.ensure_future(http.get(wg.url + "/", timeout=aiohttp.ClientTimeout(60)))
        runtime = wg.runtime("sleepy")
        await runtime.cell.wait_for(lambda s: s.phase.value == "starting")
        await asyncio.sleep(0.3)
        starting = (await targets(wg.admin))["sleepy"]
        assert starting["phase"] == "starting" and starting["held"] == 1
        assert starting["idle_seconds"] is None, starting
        held.cancel()
