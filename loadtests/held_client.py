"""Hold N concurrent GETs open at once (raw asyncio streams on uvloop); write a JSON summary."""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from collections import Counter
from urllib.parse import urlsplit

import uvloop


async def one(host: str, port: int, request: bytes, gate: asyncio.Semaphore) -> str:
    try:
        async with gate:  # bounds connects in flight, not requests held
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
        try:
            status = (await reader.readline()).split(b" ", 2)
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line[15:])
            await reader.readexactly(length)
            return "ok" if len(status) > 1 and status[1] == b"200" else f"HTTP {status[1:2]}"
        finally:
            writer.close()
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        return type(e).__name__


async def hold(url: str, n: int, connects: int, limit_s: float) -> dict[str, object]:
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    target = u.path + (f"?{u.query}" if u.query else "")
    request = f"GET {target} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n\r\n".encode()
    gate, t0 = asyncio.Semaphore(connects), time.monotonic()
    tasks = [asyncio.create_task(one(host, port, request, gate)) for _ in range(n)]
    done, pending = await asyncio.wait(tasks, timeout=limit_s)
    for t in pending:
        t.cancel()
    outcomes = Counter(t.result() for t in done)
    outcomes["timeout"] += len(pending)
    return {
        "n": n,
        "ok": outcomes.pop("ok", 0),
        "errors": {k: v for k, v in outcomes.items() if v},
        "elapsed_s": round(time.monotonic() - t0, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--connects", type=int, default=256, help="connects in flight at once")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < args.n + 100:
        print(f"!! RLIMIT_NOFILE hard limit {hard} too low for {args.n} connections", flush=True)
    result = uvloop.run(hold(args.url, args.n, args.connects, args.timeout))
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
