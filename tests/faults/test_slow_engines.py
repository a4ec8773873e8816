"""Two engines that hold their clients: one accepts connections and never answers, one
answers one byte per second. Each gets 504 at its ``timeouts.response_headers`` (a byte now and
then does not keep the head's deadline away), warmgate closes its connections to them, and a
third, healthy target's requests are all answered meanwhile; its latency without and with the
slow ones goes to a report side by side."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from tests.faults.latency import traffic, write_report
from tests.faults.upstreams import SlowUpstream, engine_process
from tests.helpers import Subprocess, wait_until

REQUESTS = 1_000
SLOW_CLIENTS = 10  # per slow target, each asking again as soon as it is answered
HEAD_TIMEOUT = 2.5  # longer than the dribbler's gap between bytes: an idle timer would not fire


def static(url: str, prefix: str, **spec: Any) -> dict[str, Any]:
    return {
        "routes": [{"path_prefix": prefix, "strip_prefix": True}],
        "backend": {"kind": "static", "url": url},
        **spec,
    }


async def test_a_silent_and_a_dribbling_engine_get_504_and_others_are_unaffected(
    tmp_path: Path,
) -> None:
    slow_timeouts = {"timeouts": {"response_headers": f"{HEAD_TIMEOUT}s"}}
    async with (
        SlowUpstream(byte_every=None) as silent,
        SlowUpstream(byte_every=1.0) as dribbler,
        engine_process(tmp_path / "engine.log") as engine,
    ):
        config = {
            "server": {"access_log": False},
            "targets": {
                "fast": static(engine, "/fast"),
                "silent": static(silent.url, "/silent", **slow_timeouts),
                "dribbler": static(dribbler.url, "/dribbler", **slow_timeouts),
            },
        }
        wg = Subprocess(config, tmp_path)
        await asyncio.to_thread(wg.start)
        slow: dict[str, Counter[int | str]] = {"silent": Counter(), "dribbler": Counter()}
        waited: list[float] = []
        try:
            url = wg.url + "/fast/item"
            await traffic(url, "warm-up", requests=100)
            alone = await traffic(url, "healthy target alone", requests=REQUESTS)

            done = asyncio.Event()
            timeout = aiohttp.ClientTimeout(total=HEAD_TIMEOUT + 20)
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:

                async def hold_on(name: str) -> None:
                    while not done.is_set():
                        started = time.monotonic()
                        try:
                            async with client.get(f"{wg.url}/{name}/x") as resp:
                                await resp.read()
                                slow[name][resp.status] += 1
                        except (aiohttp.ClientError, TimeoutError) as exc:
                            slow[name][type(exc).__name__] += 1
                        waited.append(time.monotonic() - started)

                holders = [
                    asyncio.ensure_future(hold_on(name))
                    for name in slow
                    for _ in range(SLOW_CLIENTS)
                ]
                await wait_until(lambda: silent.accepted and dribbler.bytes_sent, timeout=10)
                # At least one whole round of 504s falls within the measured traffic.
                least = time.monotonic() + HEAD_TIMEOUT + 1
                beside = await traffic(
                    url,
                    f"beside {2 * SLOW_CLIENTS} requests to slow targets",
                    requests=REQUESTS,
                    until=lambda: time.monotonic() > least,
                )
                done.set()
                await asyncio.gather(*holders)
            # warmgate let go of every connection to the slow engines.
            await wait_until(lambda: silent.open == 0 and dribbler.open == 0, timeout=10)
        finally:
            wg.stop()

    report = write_report(
        tmp_path / "slow-engines.md",
        "A healthy target beside a silent engine and a one-byte-per-second engine",
        [alone, beside],
        [
            f"timeouts.response_headers {HEAD_TIMEOUT}s on the slow targets; "
            f"{SLOW_CLIENTS} clients on each, asking again as soon as answered",
            f"slow targets' answers: silent {dict(slow['silent'])}, "
            f"one byte per second {dict(slow['dribbler'])}; each after "
            f"{min(waited):.2f}-{max(waited):.2f}s",
        ],
    )
    print("\n" + report)
    assert alone.errors == [] and alone.statuses == {200: REQUESTS}
    assert beside.errors == [] and set(beside.statuses) == {200}
    for name, answers in slow.items():
        assert set(answers) == {504}, f"{name}: {dict(answers)}"
        assert answers[504] >= SLOW_CLIENTS, f"{name}: every client answered at least once"
    assert dribbler.bytes_sent >= 2, "the dribbler did send bytes before its 504"
