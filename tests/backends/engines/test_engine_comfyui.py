"""engine: comfyui, end to end: warmgate in this process, the demo engine (a ComfyUI-compatible
subset) as a real child process started and stopped by the process backend, behind /comfy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.scale.state import Phase
from tests.helpers import (
    ROOT,
    Running,
    demo_engine,
    metric_value,
    one_target,
    wait_until,
    warmgate,
)

PREFIX = "/comfy"
NAVIGATE = {"Accept": "text/html", "Sec-Fetch-Mode": "navigate"}


def graph(steps: int = 2, size: int = 64) -> dict[str, Any]:
    """An API-format graph the demo engine renders (KSampler, EmptyLatentImage, PreviewImage)."""
    return {
        "3": {"class_type": "KSampler", "inputs": {"seed": 7, "steps": steps}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size}},
        "9": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}},
    }


def comfy_config(
    tmp_path: Path, *, render_seconds: float = 0.2, eager: bool = True, **target: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "engine": "comfyui",
        "routes": [{"path_prefix": PREFIX, "strip_prefix": True}],
        "backend": {
            "kind": "process",
            "command": demo_engine(
                render_seconds=render_seconds, checkpoint=tmp_path / "checkpoint.bin"
            ),
            "cwd": str(ROOT),
            "env": {"EAGER_LOAD_MODEL": "1" if eager else "0"},
            "stop_grace": "5s",
        },
        "readiness": {"interval": "50ms"},
        "scaling": {"idle_after": "2s", "busy_poll": "1s", "stream_activity_window": "500ms"},
        "waiting_page": "off",
    }
    return one_target("comfy", spec, **target)


def phase(wg: Running) -> Phase:
    return wg.runtime("comfy").state.phase  # type: ignore[no-any-return]


def engine_url(wg: Running) -> str:
    """The engine's own address: asking it directly is not activity through warmgate."""
    return wg.runtime("comfy").state.endpoints[0]  # type: ignore[no-any-return]


async def test_a_long_render_keeps_the_target_with_no_http_traffic(tmp_path: Path) -> None:
    config = comfy_config(tmp_path, render_seconds=5.0)
    async with warmgate(config, str(tmp_path)) as wg, aiohttp.ClientSession() as client:
        async with client.post(wg.url + PREFIX + "/prompt", json={"prompt": graph()}) as r:
            assert r.status == 200 and r.headers.get("X-Warmgate-Cold-Start")
            prompt_id = (await r.json())["prompt_id"]
        direct = engine_url(wg)
        loop = asyncio.get_running_loop()
        started = loop.time()
        # No request through warmgate from here on; watch the engine directly.
        while True:
            assert phase(wg) is Phase.READY, "released mid-render"
            async with client.get(f"{direct}/history/{prompt_id}") as r:
                if prompt_id in await r.json():
                    break
            await asyncio.sleep(0.1)
        rendered = loop.time() - started
        assert rendered > 4.0  # far past idle_after (2 s): only the queue kept it
        await wait_until(lambda: phase(wg) is Phase.COLD, timeout=6)
        # An idle window after the render (less the busy poll's granularity), not during it.
        assert loop.time() - started - rendered >= 1.0


async def test_the_warmup_workflow_runs_before_the_first_request_is_forwarded(
    tmp_path: Path,
) -> None:
    (tmp_path / "warmup.json").write_text(json.dumps(graph(steps=1, size=16)))
    # Lazy load: /system_stats answers at once, /readyz is 503 until the first prompt loads
    # the checkpoint. The first user request must find it loaded.
    config = comfy_config(tmp_path, eager=False, warmup_workflow="warmup.json")
    async with warmgate(config, str(tmp_path)) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + PREFIX + "/") as r:  # a probe would not wake it
            assert r.status == 200, await r.text()
            assert r.headers.get("X-Warmgate-Cold-Start")
        async with client.get(wg.url + PREFIX + "/readyz") as r:
            assert r.status == 200, await r.text()
        async with client.get(wg.url + PREFIX + "/history") as r:
            history = list((await r.json()).values())
        assert len(history) == 1
        number, _, _, extra, _ = history[0]["prompt"]
        assert number == 0 and extra == {"client_id": "warmgate-warmup"}
        assert history[0]["status"]["status_str"] == "success"


async def test_a_broken_warmup_workflow_fails_the_cold_start_with_its_reason(
    tmp_path: Path,
) -> None:
    (tmp_path / "warmup.json").write_text(json.dumps(graph(steps=0)))  # steps < 1: rejected
    config = comfy_config(tmp_path, warmup_workflow="warmup.json")
    async with warmgate(config, str(tmp_path)) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + PREFIX + "/") as r:
            body = await r.json()
        assert r.status == 503 and body["error"]["code"] == "target_failed"
        assert "warm-up failed" in wg.runtime("comfy").state.reason
        assert "validation" in wg.runtime("comfy").state.reason


async def test_an_idle_tab_neither_wakes_the_target_nor_keeps_it(tmp_path: Path) -> None:
    # Websockets refused while cold (the default holds them: tests/routing/test_held_websockets.py).
    config = comfy_config(tmp_path, waiting_page="auto", waiting={"hold_websockets": False})
    async with warmgate(config, str(tmp_path)) as wg, aiohttp.ClientSession() as client:
        ws_url = wg.url.replace("http", "ws", 1) + PREFIX + "/ws?clientId=tab"
        # What an open tab does against a cold target: reconnect its websocket, poll the API.
        for _ in range(3):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(ws_url)
            assert refused.value.status == 503
            for path in ("/api/queue", "/history", "/system_stats", "/api/prompt", "/object_info"):
                async with client.get(wg.url + PREFIX + path) as r:
                    assert r.status == 503 and (await r.json())["error"]["code"] == "target_cold"
        assert phase(wg) is Phase.COLD and not wg.runtime("comfy").backend.observe().running

        # A page load wakes it (the waiting page answers at once), and the page then loads.
        async with client.get(wg.url + PREFIX + "/", headers=NAVIGATE) as r:
            assert r.status == 503 and "Starting" in await r.text()
        await wait_until(lambda: phase(wg) is Phase.READY, timeout=15)
        async with client.get(wg.url + PREFIX + "/", headers=NAVIGATE) as r:
            assert r.status == 200 and "<html" in (await r.text()).lower()

        # The tab's socket is open and chatty (status frames in, an extension's keep-alive out
        # every 300 ms), yet the target is released: the queue, not the socket, says "busy".
        async with client.ws_connect(ws_url) as ws:
            first = await ws.receive_json(timeout=5)
            assert first["type"] == "status"
            released_at = time.monotonic()

            async def chatter() -> None:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    while not ws.closed:
                        await ws.send_str('{"type": "keepalive"}')
                        await asyncio.sleep(0.3)

            chatting = asyncio.ensure_future(chatter())
            closed = await ws.receive(timeout=10)
            chatting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await chatting
            assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert ws.close_code == 1001
            assert time.monotonic() - released_at > 1.0
        await wait_until(lambda: phase(wg) is Phase.COLD, timeout=10)
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await client.ws_connect(ws_url)  # the tab reconnecting does not wake it
        assert phase(wg) is Phase.COLD


async def test_a_page_load_burst_at_a_cold_target_is_served_and_the_ui_works_under_a_prefix(
    tmp_path: Path,
) -> None:
    async with warmgate(comfy_config(tmp_path), str(tmp_path)) as wg:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as client:

            async def get(path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
                async with client.get(wg.url + PREFIX + path, headers=headers) as r:
                    return r.status, await r.text()

            assets = ["/static/app.js", "/static/app.css"] * 250
            burst = [get("/", NAVIGATE), *(get(path) for path in assets)]
            results = await asyncio.wait_for(asyncio.gather(*burst), 30)
            assert [status for status, _ in results] == [200] * 501
            assert "<html" in results[0][1].lower()
            assert all(
                "function" in body
                for (_, body), p in zip(results[1:], assets, strict=True)
                if "js" in p
            )

            # The page's relative URLs ("prompt", "history/<id>", "ws") work under the prefix.
            ws_url = wg.url.replace("http", "ws", 1) + PREFIX + "/ws?clientId=me"
            async with client.ws_connect(ws_url) as ws:
                body = {"prompt": graph(), "client_id": "me"}
                async with client.post(wg.url + PREFIX + "/api/prompt", json=body) as r:
                    prompt_id = (await r.json())["prompt_id"]
                kinds = []
                while "execution_success" not in kinds:
                    msg = await ws.receive(timeout=10)
                    if msg.type is aiohttp.WSMsgType.TEXT:
                        kinds.append(json.loads(msg.data)["type"])
                assert "progress" in kinds
            async with client.get(wg.url + PREFIX + f"/history/{prompt_id}") as r:
                image = (await r.json())[prompt_id]["outputs"]["9"]["images"][0]
            async with client.get(wg.url + PREFIX + "/view", params=image) as r:
                assert r.status == 200 and r.content_type == "image/png"

            # The prefix without its slash would resolve those URLs against "/": redirected.
            async with client.get(wg.url + PREFIX + "?tab=2", allow_redirects=False) as r:
                assert r.status == 308 and r.headers["Location"] == PREFIX + "/?tab=2"
            async with client.get(wg.url + PREFIX, headers=NAVIGATE) as r:
                assert r.status == 200 and r.url.path == PREFIX + "/"
                assert "<html" in (await r.text()).lower()


READS = (
    "/api/readyz",
    "/object_info",
    "/api/object_info",
    "/api/queue",
    "/history",
    "/view?filename=a.png&type=output",
    "/api/system_stats",
)
"""The engine's reads a tab, a monitor or a person's bookmark may ask of a cold target."""


@pytest.mark.parametrize(
    "headers",
    [{}, {"Accept": "text/html"}, NAVIGATE],
    ids=["api", "accept-html", "navigation"],
)
async def test_reads_never_wake_a_cold_target_whatever_the_accept(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    config = comfy_config(tmp_path, waiting_page="auto")
    async with warmgate(config, str(tmp_path)) as wg, aiohttp.ClientSession() as client:
        for path in READS:
            async with client.get(wg.url + PREFIX + path, headers=headers) as r:
                assert r.status == 503, path
                if "text/html" in headers.get("Accept", ""):
                    page = await r.text()  # the waiting page, saying the read wakes nothing
                    assert "<b>comfy</b>" in page and "does not wake it" in page, path
        await asyncio.sleep(0.3)  # a start asked would show by now
        assert phase(wg) is Phase.COLD
        assert not wg.runtime("comfy").backend.observe().running
        assert await metric_value(wg.admin, "warmgate_cold_starts_total", target="comfy") == 0
