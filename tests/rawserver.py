"""Raw HTTP/1.1 servers on 127.0.0.1 that answer exactly what a test needs, byte for byte (an
upstream that miscounts, resets, or sends what no HTTP library would)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

Responder = Callable[[bytes], bytes | None]
"""Request head -> raw response bytes (None: close the connection without answering)."""


class RawUpstream:
    """Answers each request head with ``respond(head)``; counts connections and requests."""

    def __init__(self, respond: Responder) -> None:
        self.respond = respond
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.heads: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.lower().split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                self.heads.append(head)
                answer = self.respond(head)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


@asynccontextmanager
async def raw_upstream(respond: Responder) -> AsyncIterator[tuple[str, RawUpstream]]:
    upstream = RawUpstream(respond)
    async with serve_raw(upstream.serve) as url:
        yield url, upstream


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serve_raw(handler: Handler) -> AsyncIterator[str]:
    """A raw server; every connection it accepted is closed and its handler done on exit."""
    tasks: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        writers.append(writer)
        try:
            await handler(reader, writer)
        except (asyncio.CancelledError, ConnectionError):
            pass  # cancelled by this helper's exit, or the peer left: nothing to report
        finally:
            writer.close()

    server = await asyncio.start_server(tracked, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in writers:
            writer.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        await server.wait_closed()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)
