"""The public listener's guards, as a client meets them: ``header_timeout`` bounds every request
head on a keep-alive connection (not only the first), and during the SIGTERM drain no cold
start begins: a request held for one is answered 503 with Retry-After at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import ROOT, Subprocess, serve_app, static_config, warmgate
from tests.http.test_server import SLOW, upstream_app


@pytest.fixture
def proc() -> Iterator[list[Subprocess]]:
    started: list[Subprocess] = []
    yield started
    for p in started:
        p.stop()


def sleepy(load: float) -> dict[str, Any]:
    """A process target whose engine loads its model for ``load`` seconds."""
    return {
        "routes": [{"path_prefix": "/sleepy"}],
        "backend": {
            "kind": "process",
            "command": [
                *("python", "-m", "tests.sleepy_engine", "--port", "{port}"),
                *("--load", str(load)),
            ],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"path": "/readyz", "interval": "50ms"},
        "scaling": {"cold_start_timeout": "120s"},
    }


async def read_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return head


async def test_a_slow_second_head_on_a_keep_alive_connection_is_cut_off(
    proc: list[Subprocess], tmp_path: Path
) -> None:
    async with serve_app(upstream_app()) as url:
        config = static_config(url)
        config["server"] = {"header_timeout": "1s", "keepalive_timeout": "60s", "access_log": False}
        wg = Subprocess(config, tmp_path)
        proc.append(wg)
        await asyncio.to_thread(wg.start)
        reader, writer = await asyncio.open_connection("127.0.0.1", wg.public_port)
        for _ in range(2):  # whole heads, one after the other: served on the same connection
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_response(reader)).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(1.5)  # idle between requests is keepalive_timeout's business
        started = time.monotonic()
        closed_after = None
        for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60:
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                closed_after = time.monotonic() - started
                break
            if reader.at_eof():
                closed_after = time.monotonic() - started
                break
            await asyncio.sleep(0.1)
            await asyncio.sleep(0)  # let the reader see an EOF
        writer.close()
        assert closed_after is not None, "a second head trickling in was never cut off"


async def test_sigterm_answers_held_requests_503_with_retry_after(
    proc: list[Subprocess], tmp_path: Path
) -> None:
    async with serve_app(upstream_app()) as url:
        config = static_config(url)
        config["targets"]["sleepy"] = sleepy(load=60)  # not ready before the drain ends
        config["server"] = {"drain_grace": "20s", "access_log": False}
        wg = Subprocess(config, tmp_path)
        proc.append(wg)
        await asyncio.to_thread(wg.start)
        async with aiohttp.ClientSession() as client:
            held = asyncio.ensure_future(client.get(wg.url + "/sleepy/slow?s=0"))
            async with asyncio.timeout(20):
                while True:  # until the request is held and its cold start under way
                    async with client.get(wg.admin + "/targets") as resp:
                        sleepy_state = (await resp.json())["sleepy"]
                    if sleepy_state["held"] == 1:
                        break
                    await asyncio.sleep(0.05)
            exit_code = asyncio.ensure_future(asyncio.to_thread(wg.terminate, 30))
            response = await held
            assert response.status == 503
            assert float(response.headers["Retry-After"]) >= 1
            body = await response.json()
            assert body["error"]["code"] == "shutting_down"
            assert await exit_code == 0


async def test_no_cold_start_begins_during_the_drain() -> None:
    upstream = upstream_app()
    async with serve_app(upstream) as url:
        config = static_config(url)
        config["targets"]["sleepy"] = sleepy(load=0.1)
        config["server"] = {"drain_grace": "10s", "access_log": False}
        async with warmgate(config) as wg, aiohttp.ClientSession() as client:
            in_flight = asyncio.ensure_future(client.get(wg.url + "/slow?s=1"))
            runtime = wg.runtime("sleepy")
            await asyncio.wait_for(upstream[SLOW].wait(), 10)
            draining = asyncio.ensure_future(wg.server.stop())  # what SIGTERM does
            await asyncio.sleep(0.1)
            runtime.request_start()  # a start asked without a request (waiting page, cloud)
            await asyncio.sleep(0.5)
            assert runtime.state.phase.value == "cold", runtime.state
            assert runtime.backend.pid is None, "no engine process was started"
            response = await in_flight
            assert response.status == 200, "the drain still finishes the work in flight"
            await draining
