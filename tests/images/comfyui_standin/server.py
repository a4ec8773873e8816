"""Stand-in for ComfyUI's ``server`` module: the PromptServer a custom node registers routes on."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from aiohttp import web


class PromptServer:
    instance: ClassVar[PromptServer]

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        PromptServer.instance = self
        self.loop = loop
        self.app = web.Application()
        self.routes = web.RouteTableDef()
        self.runner: web.AppRunner | None = None
        self.port = 0

        @self.routes.get("/system_stats")
        async def system_stats(request: web.Request) -> web.Response:
            return web.json_response({"system": {"comfyui_version": "stand-in"}, "devices": []})

    def add_routes(self) -> None:
        """As ComfyUI does once the custom nodes are loaded: every route also under ``/api``."""
        api_routes = web.RouteTableDef()
        for route in self.routes:
            if isinstance(route, web.RouteDef):
                api_routes.route(route.method, "/api" + route.path)(route.handler, **route.kwargs)
        self.app.add_routes(api_routes)
        self.app.add_routes(self.routes)

    async def start_multi_address(
        self, addresses: list[tuple[str, int]], call_on_start: Any = None, verbose: bool = True
    ) -> None:
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        for address, port in addresses:
            site = web.TCPSite(self.runner, address, port)
            await site.start()
            self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        """Not in ComfyUI (its server runs until the process ends): the tests' teardown."""
        if self.runner is not None:
            await self.runner.cleanup()
