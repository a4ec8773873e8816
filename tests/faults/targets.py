"""A target's state as the admin listener's ``GET /targets`` reports it (warmgate runs as its
own process here, so the test reads what an operator reads)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.helpers import Subprocess


async def target(wg: Subprocess, name: str = "t") -> dict[str, Any]:
    async with aiohttp.ClientSession() as client, client.get(wg.admin + "/targets") as resp:
        state: dict[str, Any] = (await resp.json())[name]
        return state


async def until_phase(wg: Subprocess, phase: str, name: str = "t") -> dict[str, Any]:
    async with asyncio.timeout(30):
        while True:
            state = await target(wg, name)
            if state["phase"] == phase:
                return state
            await asyncio.sleep(0.05)
