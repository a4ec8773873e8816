"""warmgate as a real process: SIGTERM drain, slowloris, many idle connections, 1 GiB each way."""

from __future__ import annotations

import asyncio
import resource
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import yarl
from aiohttp import web

from tests.helpers import Subprocess, rss_bytes, serve_app, static_config

GIB = 2**30
CHUNK = 2**20

SLOW = web.AppKey("slow_started", asyncio.Event)


def upstream_app() -> web.Application:
    async def slow(request: web.Request) -> web.Response:
        request.app[SLOW].set()
        await asyncio.sleep(float(request.query["s"]))
        return web.Response(text="finished")

    async def download(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = GIB
        await response.prepare(request)
        block = b"\x5a" * CHUNK
        for _ in range(GIB // CHUNK):
            await response.write(block)
        await response.write_eof()
        return response

    async def upload(request: web.Request) -> web.Response:
        total = 0
        async for chunk in request.content.iter_any():
            total += len(chunk)
        return web.json_response({"received": total})

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application(client_max_size=2 * GIB)
    app[SLOW] = asyncio.Event()
    app.router.add_get("/slow", slow)
    app.router.add_get("/download", download)
    app.router.add_post("/upload", upload)
    app.router.add_get("/", hello)
    return app


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, web.Application]]:
    app = upstream_app()
    async with serve_app(app) as url:
        yield url, app


@pytest.fixture
def proc(tmp_path: Path) -> Iterator[list[Subprocess]]:
    started: list[Subprocess] = []
    yield started
    for p in started:
        p.stop()


def launch(proc: list[Subprocess], tmp_path: Path, config: dict[str, object]) -> Subprocess:
    wg = Subprocess(config, tmp_path)
    proc.append(wg)
    return wg


async def _refused(url: str) -> None:
    """Until a connection to ``url`` is refused (within 4 s)."""
    address = yarl.URL(url)
    async with asyncio.timeout(4):
        while True:
            try:
                _, writer = await asyncio.open_connection(address.host, address.port)
            except ConnectionRefusedError:
                return
            writer.close()
            await writer.wait_closed()
            await asyncio.sleep(0.05)


async def test_sigterm_drains_in_flight_requests(upstream, proc, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, app = upstream
    config = static_config(url)
    config["server"] = {"drain_grace": "10s", "access_log": False}
    wg = launch(proc, tmp_path, config)
    await asyncio.to_thread(wg.start)
    async with aiohttp.ClientSession() as client:
        in_flight = asyncio.ensure_future(client.get(wg.url + "/slow?s=5"))
        await asyncio.wait_for(app[SLOW].wait(), 5)
        exit_code = asyncio.ensure_future(asyncio.to_thread(wg.terminate, 20))
        await _refused(wg.url)  # new connections, once the SIGTERM is handled
        assert not in_flight.done(), "refused while the old request drains"
        response = await in_flight
        assert response.status == 200 and await response.text() == "finished"
        assert await exit_code == 0


async def test_slowloris_is_cut_off_and_others_are_served(upstream, proc, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _ = upstream
    config = static_config(url)
    config["server"] = {"header_timeout": "1s", "access_log": False}
    wg = launch(proc, tmp_path, config)
    await asyncio.to_thread(wg.start)
    reader, writer = await asyncio.open_connection("127.0.0.1", wg.public_port)
    closed_after = None
    loop = asyncio.get_running_loop()
    started = loop.time()
    for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 50:
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except ConnectionError:
            closed_after = loop.time() - started
            break
        if reader.at_eof():
            closed_after = loop.time() - started
            break
        async with aiohttp.ClientSession() as client, client.get(wg.url + "/") as resp:
            assert resp.status == 200
        await asyncio.sleep(0.1)
    writer.close()
    assert closed_after is not None, "a client trickling its headers was never cut off"
    assert closed_after < 5


async def test_ten_thousand_idle_connections_do_not_block_new_requests(  # type: ignore[no-untyped-def]
    upstream, proc, tmp_path: Path
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 10_500:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below 10,500")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    url, _ = upstream
    wg = launch(proc, tmp_path, static_config(url))
    await asyncio.to_thread(wg.start)
    idle: list[asyncio.StreamWriter] = []
    try:
        for _ in range(10_000):
            _, writer = await asyncio.open_connection("127.0.0.1", wg.public_port)
            idle.append(writer)
        async with aiohttp.ClientSession() as client:
            for _ in range(20):
                async with client.get(wg.url + "/") as resp:
                    assert resp.status == 200 and await resp.text() == "hello"
    finally:
        for writer in idle:
            writer.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class PeakRss:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def test_one_gib_streams_both_ways_in_bounded_memory(upstream, proc, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _ = upstream
    config = static_config(url, limits={"max_body": "2GiB"})
    wg = launch(proc, tmp_path, config)
    await asyncio.to_thread(wg.start)
    async with aiohttp.ClientSession(auto_decompress=False) as client:
        async with client.get(wg.url + "/") as resp:  # warm the pools
            await resp.read()
        baseline = rss_bytes(wg.pid)
        with PeakRss(wg.pid) as down:
            received = 0
            async with client.get(wg.url + "/download") as resp:
                async for chunk in resp.content.iter_any():
                    received += len(chunk)
        assert received == GIB

        async def body() -> AsyncIterator[bytes]:
            block = b"\xa5" * CHUNK
            for _ in range(GIB // CHUNK):
                yield block

        with PeakRss(wg.pid) as up:
            async with client.post(wg.url + "/upload", data=body()) as resp:
                assert (await resp.json())["received"] == GIB
    growth_down = down.peak - baseline
    growth_up = up.peak - baseline
    print(f"RSS growth: download {growth_down / 2**20:.1f} MiB, upload {growth_up / 2**20:.1f} MiB")
    assert growth_down < 8 * 2**20 and growth_up < 8 * 2**20
