"""An engine SIGKILLed in the middle of a server-sent event stream: the client sees its stream
cut (never a clean end), the target goes cold, and the next request wakes it again."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import psutil
import pytest

from tests.backends.test_process import alive, process_config
from tests.faults.targets import target, until_phase
from tests.helpers import Subprocess, metric_value


async def test_an_engine_killed_mid_stream_cuts_the_stream_and_the_next_request_wakes_it(
    tmp_path: Path,
) -> None:
    wg = Subprocess(process_config(load=0.2), tmp_path)
    await asyncio.to_thread(wg.start)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as client:
            headers = {"Accept": "text/event-stream"}
            async with client.get(wg.url + "/events", headers=headers) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                assert resp.headers.get("X-Warmgate-Cold-Start"), "held through the cold start"
                assert await resp.content.readline() == b"data: one\n"
                assert await resp.content.readline() == b"\n"
                (engine,) = psutil.Process(wg.pid).children()
                state = await target(wg)
                assert (state["phase"], state["streams"]) == ("ready", 1)

                os.kill(engine.pid, signal.SIGKILL)
                with pytest.raises(aiohttp.ClientPayloadError):  # cut, not a clean end
                    async with asyncio.timeout(30):
                        await resp.content.read()

            await until_phase(wg, "cold")
            assert not alive(engine.pid)
            assert psutil.Process(wg.pid).children() == [], "no engine until a request"

            async with client.get(wg.url + "/") as resp:
                assert resp.status == 200
                assert resp.headers.get("X-Warmgate-Cold-Start"), "woken by this request"
                assert (await resp.text()) != f"pid {engine.pid}"
            assert (await target(wg))["phase"] == "ready"
        assert await metric_value(wg.admin, "warmgate_cold_starts_total") == 2
        woken = psutil.Process(wg.pid).children()
        assert await asyncio.to_thread(wg.terminate, 30) == 0
        assert not any(alive(child.pid) for child in woken)
    finally:
        wg.stop()
