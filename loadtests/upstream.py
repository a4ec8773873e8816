"""Fast benchmark upstream: a raw asyncio Protocol HTTP/1.1 keep-alive server on uvloop.

Routes: GET /small (200 bytes), GET /large (1 MiB), GET /slow?s=SECONDS (answers after
the delay, or at once on /_release), GET /_stats (JSON: held slow requests, counters).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
from typing import cast

import uvloop

SMALL = b"x" * 199 + b"\n"
LARGE = b"y" * (1 << 20)
MAX_HEAD = 64 * 1024


def _head(length: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % length


def _response(body: bytes) -> bytes:
    return _head(len(body)) + body


SMALL_RESP = _response(SMALL)
LARGE_HEAD = _head(len(LARGE))
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
HELD: set[Conn] = set()
COUNTERS = {"connections": 0, "requests": 0}


class Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        COUNTERS["connections"] += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        HELD.discard(self)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.timer is None:
            self._process()

    def pause_writing(self) -> None:  # a slow reader: stop taking new requests
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def _process(self) -> None:
        t = self.transport
        while t is not None and self.timer is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    t.close()
                return
            head = bytes(self.buf[:end]).lower()
            body_len = 0
            for line in head.split(b"\r\n")[1:]:
                if line.startswith(b"content-length:"):
                    body_len = int(line[15:])
            if len(self.buf) < end + 4 + body_len:
                return
            del self.buf[: end + 4 + body_len]
            COUNTERS["requests"] += 1
            request_line = head.split(b"\r\n", 1)[0].split(b" ")
            target = request_line[1] if len(request_line) > 1 else b"/"
            http10 = request_line[-1] == b"http/1.0"
            self.close_after = b"connection: close" in head or (
                http10 and b"connection: keep-alive" not in head
            )
            self._route(t, target)

    def _route(self, t: asyncio.Transport, target: bytes) -> None:
        path, _, query = target.partition(b"?")
        if path == b"/small":
            t.write(SMALL_RESP)
        elif path == b"/large":
            t.write(LARGE_HEAD)
            t.write(LARGE)
        elif path == b"/slow":
            delay = float(dict(_kv(query)).get(b"s", b"1"))
            self.timer = asyncio.get_running_loop().call_later(delay, self.finish_slow)
            HELD.add(self)
            return
        elif path == b"/_stats":
            t.write(_response(json.dumps({"held": len(HELD), **COUNTERS}).encode()))
        elif path == b"/_release":
            for conn in list(HELD):
                conn.finish_slow()
            t.write(_response(b"released\n"))
        else:
            t.write(NOT_FOUND)
        if self.close_after:
            t.close()

    def finish_slow(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None
        HELD.discard(self)
        if self.transport is not None:
            self.transport.write(SMALL_RESP)
            if self.close_after:
                self.transport.close()
            else:
                self._process()


def _kv(query: bytes) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, _, v in (p.partition(b"=") for p in query.split(b"&"))]


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Conn, host, port, backlog=4096, reuse_address=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    raise_nofile()
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
