"""10,000 idle keep-alive client connections (each has sent one whole request and read its
answer) held open against warmgate while normal traffic runs: every request is answered, every
idle connection stays open (``keepalive_timeout`` is longer than the test) and still serves a
second request, though each has been idle longer than ``header_timeout`` (the wait between
requests is ``keepalive_timeout``'s business). Normal traffic's p50/p99 without and with them
go to a report side by side."""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.faults.latency import traffic, write_report
from tests.faults.upstreams import engine_process
from tests.helpers import Subprocess, static_config, wait_until

IDLE = 10_000
REQUESTS = 1_000
BATCH = 250  # connections opened at once (the listener's backlog is 1024)
HEADROOM = 1_000  # the test's other descriptors: its clients, pipes, the runtime's own
HEADER_TIMEOUT = 1.0


@pytest.fixture
def fd_limit() -> Iterator[None]:
    """Enough descriptors for the idle clients in this process (warmgate raises its own)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = IDLE + HEADROOM
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}: cannot hold {IDLE} connections")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def read_response(reader: asyncio.StreamReader) -> int:
    """One response (Content-Length or chunked) read whole; returns its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    fields = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
    }
    if fields.get(b"transfer-encoding") == b"chunked":
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            await reader.readexactly(size + 2)
        await reader.readuntil(b"\r\n")
    else:
        await reader.readexactly(int(fields.get(b"content-length", b"0")))
    return status


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def one_request(connection: Connection, path: str) -> int:
    reader, writer = connection
    writer.write(f"GET {path} HTTP/1.1\r\nHost: idle.test\r\n\r\n".encode())
    await writer.drain()
    return await read_response(reader)


async def open_idle(port: int, count: int) -> tuple[list[Connection], list[int]]:
    """``count`` connections, each after one whole request and its answer."""
    connections: list[Connection] = []
    statuses: list[int] = []

    async def one(i: int) -> None:
        connection = await asyncio.open_connection("127.0.0.1", port)
        connections.append(connection)
        statuses.append(await one_request(connection, f"/idle/{i}"))

    for start in range(0, count, BATCH):
        await asyncio.gather(*(one(i) for i in range(start, min(count, start + BATCH))))
    return connections, statuses


async def close(connections: list[Connection]) -> None:
    for _, writer in connections:
        writer.close()
    await asyncio.gather(*(w.wait_closed() for _, w in connections), return_exceptions=True)


def still_open(connection: Connection) -> bool:
    reader, writer = connection
    return not reader.at_eof() and not writer.is_closing() and reader.exception() is None


@pytest.mark.usefixtures("fd_limit")
async def test_ten_thousand_idle_connections_leave_normal_traffic_answered(
    tmp_path: Path,
) -> None:
    connections: list[Connection] = []
    async with engine_process(tmp_path / "engine.log") as engine:
        config = static_config(engine)
        config["server"] = {
            "access_log": False,
            "keepalive_timeout": "300s",
            "header_timeout": f"{HEADER_TIMEOUT}s",
        }
        wg = Subprocess(config, tmp_path)
        await asyncio.to_thread(wg.start)
        try:
            url = wg.url + "/normal"
            await traffic(url, "warm-up", requests=100)
            without = await traffic(url, "normal traffic alone", requests=REQUESTS)

            started = time.monotonic()
            connections, idle_statuses = await open_idle(wg.public_port, IDLE)
            opened_in = time.monotonic() - started
            fds = psutil.Process(wg.pid).num_fds()

            with_idle = await traffic(url, f"with {IDLE} idle connections", requests=REQUESTS)
            # Every idle connection has waited past header_timeout; an EOF or a reset from
            # warmgate would be seen by now.
            await asyncio.sleep(
                max(0.2, started + opened_in + 2 * HEADER_TIMEOUT - time.monotonic())
            )
            open_after = sum(still_open(c) for c in connections)
            reused = await asyncio.gather(*(one_request(c, "/again") for c in connections[::50]))
            rss = psutil.Process(wg.pid).memory_info().rss
            await close(connections)
            # warmgate lets go of them as the clients leave, before the last run.
            await wait_until(lambda: psutil.Process(wg.pid).num_fds() < HEADROOM, timeout=30)
            after = await traffic(
                url, "normal traffic alone, after closing them", requests=REQUESTS
            )
        finally:
            await close(connections)
            wg.stop()

    report = write_report(
        tmp_path / "idle-connections.md",
        f"Normal traffic with and without {IDLE} idle keep-alive connections",
        [without, with_idle, after],
        [
            f"{REQUESTS} GETs each, 4 keep-alive clients; warmgate and the engine are processes "
            "apart from the clients; the run after closing them shows the machine's own drift",
            f"{IDLE} idle connections opened (one request each) in {opened_in:.1f}s; "
            f"warmgate then held {fds} descriptors and {rss / 2**20:.0f} MiB resident",
        ],
    )
    print("\n" + report)
    assert idle_statuses == [200] * IDLE
    assert fds > IDLE, "warmgate holds every idle connection"
    assert without.errors == [] and without.statuses == {200: REQUESTS}
    assert with_idle.errors == [] and with_idle.statuses == {200: REQUESTS}
    assert after.errors == [] and after.statuses == {200: REQUESTS}
    assert open_after == IDLE, f"{IDLE - open_after} idle connections were closed before 300 s"
    assert reused == [200] * len(reused), "an idle connection still serves its next request"
