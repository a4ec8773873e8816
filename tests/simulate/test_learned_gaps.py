"""``idle_after: auto`` learns the same gaps live as in the replay: a real ``warmgate serve`` in
front of the demo engine (ComfyUI's API), used as a tab uses it (a prompt, then ``/history``
polled until the render is done), then left alone for a few seconds, twice. Each pause is a gap
in ``/targets`` and in the state file, as in ``warmgate simulate`` over the server's own access
log. The polls come while the engine's busy window still runs past the render: they end no gap
and leave the pause that follows to be learned."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from router.config import parse_config
from router.simulate.accesslog import convert
from router.simulate.backends import Duration
from router.simulate.run import Options, replay
from tests.backends.test_demo_engine import graph
from tests.helpers import ROOT, Subprocess, demo_engine, wait_until

PAUSE = 8.0
"""Seconds left alone after a render is done: past the lower bound (3 s) once the engine's busy
window (``busy_poll`` + 1 s = 2 s at most past the render, stamped when the poll answers) is
counted in the burst, with room for a slow poll."""
PAUSES = 2


def _config(state_dir: Path) -> dict[str, Any]:
    return {
        "state_dir": str(state_dir),
        "targets": {
            "demo": {
                "engine": "comfyui",
                "routes": [{"path_prefix": "/"}],
                "backend": {
                    "kind": "process",
                    "command": demo_engine(render_seconds=2.5),  # a poll sees the render
                    "port": 0,
                    "cwd": str(ROOT),
                    "env": {"EAGER_LOAD_MODEL": "1"},
                    "stop_grace": "5s",
                },
                "readiness": {"path": "/readyz", "interval": "100ms"},
                "scaling": {
                    "idle_after": "auto",
                    "idle_bounds": ["3s", "30s"],
                    "busy_poll": "1s",
                    "cold_start_timeout": "60s",
                },
            }
        },
    }


async def _render(session: aiohttp.ClientSession, url: str) -> None:
    """One prompt, then its history polled until it is done (what the UI does)."""
    async with session.post(f"{url}/prompt", json={"prompt": graph()}) as response:
        assert response.status == 200, await response.text()
        prompt_id = (await response.json())["prompt_id"]
    while True:
        async with session.get(f"{url}/history/{prompt_id}") as response:
            entry = (await response.json()).get(prompt_id)
        if entry and entry.get("outputs"):
            return
        await asyncio.sleep(0.1)


async def _learned(session: aiohttp.ClientSession, admin: str) -> int:
    async with session.get(f"{admin}/targets") as response:
        gaps: int = (await response.json())["demo"]["learned"]["gaps"]
    return gaps


def _kept(state_dir: Path) -> int | None:
    path = state_dir / "demo.idle.json"
    return json.loads(path.read_text())["gaps"] if path.exists() else None


async def test_live_server_learns_each_pause_as_the_replay_does(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    server = Subprocess(_config(state_dir), tmp_path).start()
    seen: list[int] = []
    try:
        async with aiohttp.ClientSession() as session:
            await _render(session, server.url)  # a cold start, then the first burst
            seen.append(await _learned(session, server.admin))
            for _ in range(PAUSES):
                await asyncio.sleep(PAUSE)
                await _render(session, server.url)
                seen.append(await _learned(session, server.admin))
            assert seen == list(range(PAUSES + 1))  # the time before the first use is no gap
            await wait_until(lambda: _kept(state_dir) == PAUSES)  # written through, while up
    finally:
        server.terminate()

    config = parse_config(_config(state_dir), "gaps", str(ROOT))
    converted = convert(server.log.read_text().splitlines(), "warmgate.log")
    assert [r.kind for r in converted.trace.requests] == ["render"] * (PAUSES + 1)
    options = Options(cold_start={"*": Duration(0.5, 0.5)}, tail=10.0)
    result = await asyncio.to_thread(replay, config, converted.trace, options)  # its own loop
    assert result.targets["demo"].gaps == PAUSES == _kept(state_dir)
