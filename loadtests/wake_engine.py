"""A tiny engine for the cold-start sections, started by warmgate as a ``kind: process`` target.

/readyz answers 503 until the engine is ready (``--ready-after`` seconds after it started, and
``--ready-file`` exists when given), then 200. Every other path answers 200 with a small body.

Per process it records, as one JSON line appended to ``--record``, the CLOCK_MONOTONIC time
(system-wide, so comparable across processes) at which it sent its first 200 on /readyz and at
which the first other request arrived: their difference is warmgate's wake latency ("readiness
observed -> first held request forwarded"), measured from outside warmgate.

    python -m loadtests.wake_engine --port P [--ready-after S] [--ready-file F] [--record R]
                                    [--cpus 1,2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import cast

import uvloop

MAX_HEAD = 64 * 1024
BODY = b"woken\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)
READY = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"
NOT_READY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\n\r\nloading.\n"


class Engine:
    def __init__(self, ready_after: float, ready_file: str | None, record: str | None) -> None:
        self.started = time.monotonic()
        self.ready_after = ready_after
        self.ready_file = ready_file
        self.record = record
        self.ready_at: float | None = None
        self.first_at: float | None = None
        self.requests = 0

    def ready(self) -> bool:
        if time.monotonic() - self.started < self.ready_after:
            return False
        return self.ready_file is None or os.path.exists(self.ready_file)

    def probe(self) -> bytes:
        if not self.ready():
            return NOT_READY
        if self.ready_at is None:
            self.ready_at = time.monotonic()  # just before the 200 is written
        return READY

    def request(self, arrived: float) -> bytes:
        self.requests += 1
        if self.first_at is None:
            self.first_at = arrived
            if self.record:
                line = {
                    "pid": os.getpid(),
                    "started": self.started,
                    "ready_at": self.ready_at,
                    "first_at": arrived,
                }
                with open(self.record, "a") as out:
                    out.write(json.dumps(line) + "\n")
        return OK


class Conn(asyncio.Protocol):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        arrived = time.monotonic()
        self.buf += data
        transport = self.transport
        while transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    transport.close()
                return
            head = bytes(self.buf[:end]).lower()
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line.startswith(b"content-length:"):
                    length = int(line[15:])
            if len(self.buf) < end + 4 + length:
                return
            del self.buf[: end + 4 + length]
            target = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
            path = target.partition(b"?")[0]
            if path == b"/readyz":
                transport.write(self.engine.probe())
            else:
                transport.write(self.engine.request(arrived))
            if b"connection: close" in head:
                transport.close()
                return


async def serve(args: argparse.Namespace) -> None:
    engine = Engine(args.ready_after, args.ready_file, args.record)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Conn(engine), args.host, args.port, backlog=8192, reuse_address=True
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ready-after", type=float, default=0.0, help="seconds after start")
    ap.add_argument("--ready-file", help="also wait until this file exists")
    ap.add_argument("--record", help="append one JSON line per process: ready_at, first_at")
    ap.add_argument("--cpus", help="run on these CPUs (comma-separated), not warmgate's")
    args = ap.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    uvloop.run(serve(args))


if __name__ == "__main__":
    main()
