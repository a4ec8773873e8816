"""Upstreams for the fault suite: the sleepy test engine as its own process (a fast engine that
shares no event loop with the test's clients), and raw servers that misbehave on purpose: one
that accepts and never answers, one that answers one byte per second."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from tests.helpers import ROOT, free_port

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


@asynccontextmanager
async def engine_process(log: Path) -> AsyncIterator[str]:
    """``python -m tests.sleepy_engine`` on a free port, ready; yields its base URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "tests.sleepy_engine", "--port", str(port), "--load", "0"),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        async with aiohttp.ClientSession() as client, asyncio.timeout(30):
            while True:
                if proc.returncode is not None:
                    output = await asyncio.to_thread(log.read_text)
                    raise RuntimeError("the engine exited:\n" + output)
                with contextlib.suppress(aiohttp.ClientError):
                    async with client.get(url + "/readyz") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.05)
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


class SlowUpstream:
    """A raw HTTP server that reads each request head and then either never answers
    (``byte_every=None``) or answers a whole 200 one byte every ``byte_every`` seconds.
    Counts the connections it has accepted and those still open."""

    def __init__(self, byte_every: float | None) -> None:
        self.byte_every = byte_every
        self.accepted = 0
        self.open = 0
        self.bytes_sent = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> SlowUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.accepted += 1
        self.open += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            if self.byte_every is None:
                await reader.read()  # silent: until the other side closes
                return
            for byte in ANSWER:
                writer.write(bytes([byte]))
                await writer.drain()
                self.bytes_sent += 1
                # Between bytes, notice at once when the other side gives up.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.byte_every):
                        if not await reader.read(1):
                            return
        except (asyncio.CancelledError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            self._tasks.discard(task)
            writer.close()
