"""The simulator and the live server share the decision code: a short trace replayed by
``warmgate simulate``'s replay and sent, at the same times, to a real ``warmgate serve`` with the
demo engine gives the same cold starts and the same phase sequence; and the live server's access
log, converted back, is that trace."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp

from router.config import parse_config
from router.simulate.accesslog import convert
from router.simulate.backends import Duration
from router.simulate.run import Options, replay
from router.simulate.trace import parse
from tests.helpers import ROOT, Subprocess, demo_engine, metric_value, wait_until

TRACE = """time,target,kind,work_seconds
0,demo,render,0.2
0.4,demo,render,0.2
0.8,demo,render,0.2
14,demo,render,0.2
14.5,demo,render,0.2
28,demo,render,0.2
"""
PHASE = re.compile(r"warmgate\.lifecycle demo: (\w+) -> (\w+)")


def _config() -> dict[str, Any]:
    return {
        "targets": {
            "demo": {
                "engine": "http",
                "routes": [{"path_prefix": "/"}],
                "backend": {
                    "kind": "process",
                    "command": demo_engine(render_seconds=None),
                    "port": 0,
                    "cwd": str(ROOT),
                    "env": {"EAGER_LOAD_MODEL": "1"},
                    "stop_grace": "5s",
                },
                "readiness": {"path": "/readyz", "interval": "100ms"},
                "scaling": {"idle_after": "2s", "cold_start_timeout": "60s"},
            }
        }
    }


async def _send_live(url: str, trace_text: str) -> None:
    trace = parse(trace_text)
    began = time.monotonic()
    async with aiohttp.ClientSession() as session:

        async def one(at: float, work: float) -> None:
            await asyncio.sleep(max(0.0, began + at - time.monotonic()))
            async with session.post(f"{url}/render-{work}", data=b"x") as response:
                await response.read()
                assert response.status < 500, response.status

        await asyncio.gather(*(one(r.at, r.work_seconds or 0.0) for r in trace.requests))


async def test_simulated_and_live_agree(tmp_path: Path) -> None:
    server = Subprocess(_config(), tmp_path).start()
    try:
        await _send_live(server.url, TRACE)
        # the last release: idle_after, then the stop
        await wait_until(lambda: server.log.read_text().count("-> cold") == 3, timeout=30)
        live_starts = await metric_value(server.admin, "warmgate_cold_starts_total", target="demo")
    finally:
        server.terminate()
    log = server.log.read_text()
    live_phases = [new for _old, new in PHASE.findall(log)]

    config = parse_config(_config(), "fidelity", str(ROOT))
    options = Options(cold_start={"*": Duration(1.0, 1.0)}, stop=Duration(0.2, 0.2), tail=10.0)
    result = await asyncio.to_thread(replay, config, parse(TRACE), options)  # its own loop
    record = result.targets["demo"]
    simulated_phases = [phase for _at, phase in record.phases[1:]]

    assert record.cold_starts == live_starts == 3
    lifecycle = "\n".join(line for line in log.splitlines() if "warmgate.lifecycle" in line)
    assert simulated_phases == live_phases == ["starting", "ready", "draining", "cold"] * 3, (
        lifecycle
    )
    assert sum(o.cold for o in result.outcomes) >= 3

    converted = convert(log.splitlines(), "warmgate.log")
    kinds = [(r.target, r.kind) for r in converted.trace.requests]
    assert kinds == [("demo", "render")] * 6
