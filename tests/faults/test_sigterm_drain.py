"""SIGTERM with 200 requests held for a cold start under way and 20 in flight on a ready
target: every one is answered before warmgate exits (the held ones 503 with Retry-After, since
no cold start finishes during the drain; the ones in flight with their response), warmgate
exits 0 within ``drain_grace`` and leaves no child behind."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from tests.backends.test_process import alive
from tests.faults.targets import target
from tests.helpers import ROOT, Subprocess

HELD = 200
IN_FLIGHT = 20
DRAIN_GRACE = 20.0
SLOW = 10.0
"""Seconds each request in flight takes: within the drain's grace."""


def sleepy(prefix: str, load: float) -> dict[str, Any]:
    """A process target at ``prefix`` whose engine loads its model for ``load`` seconds."""
    return {
        "routes": [{"path_prefix": prefix, "strip_prefix": True}],
        "backend": {
            "kind": "process",
            "command": [
                *("python", "-m", "tests.sleepy_engine"),
                *("--port", "{port}", "--load", str(load)),
            ],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"path": "/readyz", "interval": "50ms"},
        "scaling": {"idle_after": "30m", "cold_start_timeout": "120s"},
    }


async def test_sigterm_with_200_held_answers_every_request_and_leaves_no_child(
    tmp_path: Path,
) -> None:
    config = {
        "server": {"access_log": False, "drain_grace": f"{DRAIN_GRACE}s"},
        "targets": {
            "warm": sleepy("/warm", load=0.1),
            "cold": sleepy("/cold", load=120),  # still loading when the drain ends
        },
    }
    wg = Subprocess(config, tmp_path)
    await asyncio.to_thread(wg.start)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=DRAIN_GRACE + 30)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
            async with client.get(wg.url + "/warm/") as resp:
                assert resp.status == 200

            async def ask(path: str) -> tuple[int, str | None, float]:
                async with client.get(wg.url + path) as resp:
                    await resp.read()
                    return resp.status, resp.headers.get("Retry-After"), time.monotonic()

            in_flight = [  # still in flight at the SIGTERM, however slowly the 200 connect
                asyncio.ensure_future(ask(f"/warm/slow?s={SLOW:g}&i={i}")) for i in range(IN_FLIGHT)
            ]
            held = [asyncio.ensure_future(ask(f"/cold/item/{i}")) for i in range(HELD)]
            async with asyncio.timeout(30):
                while True:
                    warm, cold = await target(wg, "warm"), await target(wg, "cold")
                    if (warm["in_flight"], cold["held"]) == (IN_FLIGHT, HELD):
                        break
                    await asyncio.sleep(0.05)
            assert cold["phase"] == "starting"
            children = psutil.Process(wg.pid).children(recursive=True)
            assert len(children) >= 2, "both engines run: the warm one and the loading one"

            sigterm = time.monotonic()
            exit_code = asyncio.ensure_future(asyncio.to_thread(wg.terminate, DRAIN_GRACE + 20))
            held_answers = await asyncio.gather(*held)
            flight_answers = await asyncio.gather(*in_flight)
            assert await exit_code == 0
            exited = time.monotonic()

        assert [status for status, _, _ in flight_answers] == [200] * IN_FLIGHT
        assert [status for status, _, _ in held_answers] == [503] * HELD
        retry_after = [float(after) for _, after, _ in held_answers if after is not None]
        assert len(retry_after) == HELD and min(retry_after) >= 1
        left = [child.pid for child in children if alive(child.pid)]
        assert left == [], f"children left after warmgate exited: {left}"
    finally:
        wg.stop()
    last_held = max(at for _, _, at in held_answers) - sigterm
    last_flight = max(at for _, _, at in flight_answers) - sigterm
    print(
        f"\nSIGTERM drain (drain_grace {DRAIN_GRACE:.0f}s): {HELD} held answered 503 by "
        f"{last_held:.2f}s, {IN_FLIGHT} in flight answered 200 by {last_flight:.2f}s, "
        f"exit 0 at {exited - sigterm:.2f}s, {len(children)} children stopped"
    )
