"""A small engine for process-backend tests: ready after ``--load`` seconds, a slow endpoint,
a silent websocket, an event stream that goes quiet after one event, and a way to crash.
Run as ``python -m tests.sleepy_engine --port P``."""

from __future__ import annotations

import argparse
import asyncio
import os

from aiohttp import WSMsgType, web

LOADED = web.AppKey("loaded", asyncio.Event)
LOADER = web.AppKey("loader", asyncio.Future)


def build(load: float) -> web.Application:
    async def load_model(app: web.Application) -> None:
        async def later() -> None:
            await asyncio.sleep(load)
            app[LOADED].set()

        app[LOADER] = asyncio.ensure_future(later())

    async def readyz(request: web.Request) -> web.Response:
        ok = request.app[LOADED].is_set()
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query.get("s", "1")))
        return web.Response(text="slow done")

    async def crash(request: web.Request) -> web.Response:
        os._exit(17)

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        async for msg in sock:
            if msg.type is WSMsgType.TEXT:
                await sock.send_str(msg.data)
        return sock

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        await asyncio.Event().wait()  # quiet until the connection ends
        return response

    async def page(request: web.Request) -> web.Response:
        return web.Response(
            text="<html><body><h1>engine page</h1></body></html>", content_type="text/html"
        )

    async def no_info(request: web.Request) -> web.Response:
        return web.json_response({"detail": "Not Found"}, status=404)

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"pid {os.getpid()}")

    app = web.Application()
    app[LOADED] = asyncio.Event()
    app.on_startup.append(load_model)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/slow", slow)
    app.router.add_get("/crash", crash)
    app.router.add_get("/ws", ws)
    app.router.add_get("/page", page)
    app.router.add_get("/events", events)
    app.router.add_get("/gradio_api/info", no_info)  # an app with no API description
    app.router.add_route("*", "/{tail:.*}", hello)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    web.run_app(build(args.load), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
