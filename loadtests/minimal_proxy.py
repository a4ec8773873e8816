"""Baseline: a minimal aiohttp + uvloop streaming pass-through proxy (one upstream)."""

from __future__ import annotations

import argparse
import asyncio
import resource

import uvloop
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


async def serve(port: int, upstream: str) -> None:
    session = ClientSession(
        upstream,
        connector=TCPConnector(limit=0),
        auto_decompress=False,
        timeout=ClientTimeout(total=None, sock_connect=5),
    )

    async def proxy(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = request.content if request.body_exists else None
        async with session.request(
            request.method, request.rel_url, headers=headers, data=body, allow_redirects=False
        ) as up:
            resp = web.StreamResponse(
                status=up.status,
                headers={k: v for k, v in up.headers.items() if k.lower() not in HOP},
            )
            resp.content_length = up.content_length
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:8081")
    args = ap.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvloop.run(serve(args.port, args.upstream))
