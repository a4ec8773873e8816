"""The waiting page's status poll and the release pacing (``waiting.release_rate``): a poll of a
target that is already ready takes no turn, so strangers' polls that go away (unauthenticated,
on the public listener) hold back no page that really waits. A real warmgate on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from router.routing.dispatch import is_asset
from router.scale.state import Phase
from tests.helpers import ROOT, one_target, serve_app, warmgate

PAGE = {"Accept": "text/html", "Sec-Fetch-Mode": "navigate"}
PACED = {"release_rate": 0.001}
"""One turn in 1,000 s: a poll that took a turn would hold the next one back for that long."""


async def dropped_poll(port: int) -> None:
    """A client that asks for the status and goes away after a moment, answered or not."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /.warmgate/status/t?wait=5 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.2):
                await reader.read(1)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_dropped_polls_of_a_ready_target_keep_no_turn_from_a_real_page() -> None:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text="the engine")

    app = web.Application()
    app.router.add_get("/", page)
    async with serve_app(app) as engine:
        spec = {"routes": [{"path_prefix": "/"}], "backend": {"kind": "static", "url": engine}}
        async with warmgate(one_target("t", spec, waiting=PACED)) as wg:
            runtime = wg.runtime()
            assert runtime.state.phase is Phase.READY  # static: always on
            port = wg.server.public_port
            for _ in range(4):
                await asyncio.gather(*[dropped_poll(port) for _ in range(50)])
            assert runtime.turns.waiting == 0
            url = wg.url + "/.warmgate/status/t"
            # A guard, not a measure: a turn kept by each dropped poll is 1,000 s long.
            async with (
                aiohttp.ClientSession() as http,
                asyncio.timeout(60),
                http.get(url, params={"wait": "1"}) as resp,
            ):
                assert resp.status == 200
                assert (await resp.json())["ready"]
            assert runtime.turns.waiting == 0


def sleepy(load: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.sleepy_engine", "--port", "{port}", "--load", str(load)]
    return {
        "routes": [{"path_prefix": "/"}],
        "backend": {"kind": "process", "command": command, "cwd": str(ROOT), "stop_grace": "2s"},
        "readiness": {"path": "/readyz", "interval": "50ms"},
    }


ICON_ASKED = {"Accept": "image/avif,image/webp,*/*", "Sec-Fetch-Dest": "image"}
"""What a browser's request for a page's icon carries (``Sec-Fetch-Mode: no-cors``)."""


async def test_twelve_tabs_favicons_held_through_a_start_go_on_without_a_turn() -> None:
    async with (
        warmgate(one_target("t", sleepy(load=2), waiting=PACED)) as wg,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(wg.url + "/", headers=PAGE) as page:
            assert page.status == 503  # the waiting page; the start is asked for
            # It carries its own icon, so a tab waiting on it asks the target for none.
            assert '<link rel="icon" href="data:image/svg+xml,' in await page.text()

        async def favicon(headers: dict[str, str]) -> int:
            async with http.get(wg.url + "/favicon.ico", headers=headers) as resp:
                return resp.status

        # A guard, not a measure: one turn is 1,000 s long, and a favicon took one each.
        async with asyncio.timeout(60):
            asked = [favicon(ICON_ASKED) for _ in range(11)] + [favicon({})]
            statuses = await asyncio.gather(*asked)
        assert statuses == [200] * 12  # the engine's answer (its catch-all)
        assert wg.runtime().turns.waiting == 0


def test_only_a_pages_sub_resources_skip_the_line() -> None:
    def asset(method: str, path: str, **headers: str) -> bool:
        return is_asset(make_mocked_request(method, path, headers=headers))

    assert asset("GET", "/favicon.ico", **ICON_ASKED)
    assert asset("GET", "/gradio_api/file=app.css", **{"Sec-Fetch-Dest": "style"})
    assert asset("GET", "/favicon.ico")  # no Sec-Fetch-Dest: an icon by its path
    assert asset("HEAD", "/sub/favicon.ico")
    assert not asset("GET", "/", **PAGE, **{"Sec-Fetch-Dest": "document"})
    assert not asset("GET", "/gradio_api/info", **{"Sec-Fetch-Dest": "empty"})  # a call
    assert not asset("GET", "/favicon.ico", **{"Sec-Fetch-Dest": "empty"})  # fetch()ed
    assert not asset("POST", "/upload", **{"Sec-Fetch-Dest": "image"})
    assert not asset("GET", "/run/predict")
