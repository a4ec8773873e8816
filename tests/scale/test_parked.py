"""The parked tier and GPU pools with real processes behind a real warmgate: the demo engine
(ComfyUI's API, ``POST /free``), a fake vLLM speaking the real sleep-mode endpoints, a fake
cloud through the ``openai`` SDK."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from router.scale.state import Phase, TargetState
from tests.fake_openai import FakeOpenAI
from tests.helpers import ROOT, metric_value, serve_app, wait_until, warmgate
from tests.openai_stack import CLOUD_KEY, KEY_ENV, PRICES

PAGE = {"Accept": "text/html,application/xhtml+xml", "Sec-Fetch-Mode": "navigate"}


def demo(
    name: str,
    tmp: Path,
    *,
    render: float = 0.2,
    park_after: str = "1s",
    pool: str | None = None,
    priority: int = 0,
    **scaling: Any,
) -> dict[str, Any]:
    """The demo engine as a ``process`` target at ``/<name>``: a 1 MiB checkpoint of its own."""
    command = [
        sys.executable, "-m", "backends.demo_engine", "--port", "{port}",
        "--checkpoint-size", "1MiB", "--checkpoint", str(tmp / f"{name}.bin"),
        "--render-seconds", str(render), "--steps", "2",
    ]  # fmt: skip
    spec: dict[str, Any] = {
        "engine": "comfyui",
        "routes": [{"path_prefix": f"/{name}", "strip_prefix": True}],
        "backend": {"kind": "process", "command": command, "cwd": str(ROOT), "stop_grace": "5s"},
        "readiness": {"path": "/readyz", "interval": "50ms"},
        "scaling": {
            "park_after": park_after,
            "idle_after": "10m",
            "cold_start_timeout": "60s",
            "busy_poll": "200ms",
            **scaling,
        },
        "priority": priority,
    }
    if pool is not None:
        spec["pool"] = pool
    return spec


def config(targets: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": targets,
        **top,
    }


def graph(text: str = "a red fox") -> dict[str, Any]:
    """ComfyUI's default text-to-image workflow in API format, small."""
    return {
        "3": {"class_type": "KSampler", "inputs": {"seed": 7, "steps": 2, "model": ["4", 0],
              "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["5", 0]}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "demo"}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64,
              "batch_size": 1}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": text, "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "t", "images": ["8", 0]}},
    }  # fmt: skip


async def prompt(client: aiohttp.ClientSession, url: str) -> tuple[str, str | None]:
    """Queue a render: its prompt id, and how long warmgate held the request (if it did)."""
    async with client.post(url + "/prompt", json={"prompt": graph()}) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["prompt_id"], resp.headers.get("X-Warmgate-Cold-Start")


async def rendered(client: aiohttp.ClientSession, url: str, prompt_id: str) -> None:
    """Wait until the render is in /history (through warmgate: reads keep a ready engine busy
    only while they are in flight)."""
    for _ in range(400):
        async with client.get(f"{url}/history/{prompt_id}") as resp:
            if prompt_id in await resp.json():
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{prompt_id} was not rendered")


async def checkpoint(client: aiohttp.ClientSession, endpoint: str) -> dict[str, Any]:
    """What the engine itself says is resident (straight to it, not through warmgate)."""
    async with client.get(endpoint + "/system_stats") as resp:
        body: dict[str, Any] = await resp.json()
        return body["checkpoint"]  # type: ignore[no-any-return]


def parked(runtime: Any) -> bool:
    """Parked, the engine's park done."""
    state: TargetState = runtime.state
    return state.phase is Phase.PARKED and not state.parking and not state.waking


def phases_of(runtime: Any) -> list[TargetState]:
    seen: list[TargetState] = []
    runtime.cell.subscribe(lambda old, new: seen.append(new))
    return seen


async def test_parked_after_idle_then_a_prompt_wakes_the_same_process(tmp_path: Path) -> None:
    async with warmgate(config({"comfy": demo("comfy", tmp_path)})) as wg:
        runtime = wg.runtime("comfy")
        url = wg.url + "/comfy"
        async with aiohttp.ClientSession() as client:
            prompt_id, cold = await prompt(client, url)
            assert cold is not None, "the first render waited for a cold start"
            await rendered(client, url, prompt_id)
            pid = runtime.backend.pid
            endpoint = runtime.state.endpoints[0]
            assert (await checkpoint(client, endpoint))["state"] == "loaded"
            await wait_until(lambda: parked(runtime), timeout=20)
            freed = await checkpoint(client, endpoint)
            assert (freed["state"], freed["resident_bytes"]) == ("parked", 0)
            assert runtime.backend.pid == pid, "parked: the process stays"

            prompt_id, held = await prompt(client, url)
            assert held is not None, "held through the wake"
            await rendered(client, url, prompt_id)
            assert runtime.backend.pid == pid and runtime.state.endpoints[0] == endpoint
            assert runtime.state.reason.startswith("woke in")
            assert (await checkpoint(client, endpoint))["state"] == "loaded", "reloaded"
        assert await metric_value(wg.admin, "warmgate_parks_total", target="comfy") >= 1
        assert await metric_value(wg.admin, "warmgate_wake_seconds_count", target="comfy") == 1
        assert await metric_value(wg.admin, "warmgate_cold_starts_total", target="comfy") == 1
        phases = await metric_value(
            wg.admin, "warmgate_target_phase", target="comfy", phase="ready"
        )
        assert phases == 1


async def test_no_park_while_a_render_runs(tmp_path: Path) -> None:
    """park_after is shorter than the render: the render's queue keeps the target ready (the
    last look at the queue right before a park sees it), then it parks."""
    spec = demo("comfy", tmp_path, render=3.0, park_after="500ms")
    async with warmgate(config({"comfy": spec})) as wg, aiohttp.ClientSession() as client:
        runtime = wg.runtime("comfy")
        url = wg.url + "/comfy"
        prompt_id, _ = await prompt(client, url)  # a cold start, then a 3-second render
        seen = phases_of(runtime)
        endpoint = runtime.state.endpoints[0]
        for _ in range(200):  # straight to the engine: /history reads through warmgate count
            async with client.get(f"{endpoint}/history/{prompt_id}") as resp:
                if prompt_id in await resp.json():
                    break
            await asyncio.sleep(0.05)
        assert [s.phase for s in seen if s.phase is Phase.PARKED] == [], "parked mid-render"
        await wait_until(lambda: parked(runtime), timeout=20)


async def test_reads_to_a_parked_target_are_answered_by_its_process(tmp_path: Path) -> None:
    """A finished render stays fetchable once its target parks: the reads a tab makes (or a
    script fetching its image) are forwarded to the parked process, which answers them without
    its weights, and neither wake it nor keep it from its release."""
    async with warmgate(config({"comfy": demo("comfy", tmp_path)})) as wg:
        runtime = wg.runtime("comfy")
        url = wg.url + "/comfy"
        async with aiohttp.ClientSession() as client:
            prompt_id, _ = await prompt(client, url)
            await rendered(client, url, prompt_id)
            async with client.get(f"{url}/history/{prompt_id}") as resp:
                image = (await resp.json())[prompt_id]["outputs"]["9"]["images"][0]
            await wait_until(lambda: parked(runtime), timeout=20)
            seen = phases_of(runtime)
            idle_since = runtime.activity.last_request
            reads = ["/history", f"/history/{prompt_id}", "/queue", "/object_info",
                     "/system_stats", "/api/queue"]  # fmt: skip
            for path in reads:
                for headers in ({}, PAGE):  # opened in a tab too: answered, not a page
                    async with client.get(url + path, headers=headers) as resp:
                        assert resp.status == 200, (path, resp.status, await resp.text())
            for headers in ({}, PAGE):
                async with client.get(url + "/view", params=image, headers=headers) as resp:
                    assert resp.status == 200 and resp.content_type == "image/png"
                    assert (await resp.read()).startswith(b"\x89PNG")
            assert [s.phase for s in seen] == [], "no wake, no phase change"
            assert parked(runtime)
            assert runtime.activity.last_request == idle_since, "no activity: released in time"
            endpoint = runtime.state.endpoints[0]
            assert (await checkpoint(client, endpoint))["state"] == "parked", "no reload"


async def test_the_waiting_page_says_waking_and_the_wake_is_a_page_load(tmp_path: Path) -> None:
    async with warmgate(config({"comfy": demo("comfy", tmp_path)})) as wg:
        runtime = wg.runtime("comfy")
        async with aiohttp.ClientSession() as client:
            await prompt(client, wg.url + "/comfy")
            await wait_until(lambda: parked(runtime), timeout=20)
            async with client.get(wg.url + "/.warmgate/status/comfy") as resp:
                status = await resp.json()
            assert (status["phase"], status["parked"], status["ready"]) == ("parked", True, False)
            assert status["waking"] is False, "parked, and nobody wakes it"
            async with client.get(wg.url + "/comfy/", headers=PAGE) as resp:
                assert resp.status == 503
                page = await resp.text()
            assert "<title>Waking comfy…</title>" in page
            async with client.get(wg.url + "/.warmgate/status/comfy?wait=5") as resp:
                status = await resp.json()  # answered once the page load's wake began
            assert status["waking"] is True or status["ready"] is True
            await wait_until(lambda: runtime.state.phase is Phase.READY, timeout=20)
            async with client.get(wg.url + "/comfy/", headers=PAGE) as resp:
                assert resp.status == 200


async def test_pool_displacement_parks_the_lowest_priority_longest_idle(tmp_path: Path) -> None:
    pools = {"ws": {"capacity": 2, "yield_after": "500ms"}}
    targets = {
        "high": demo("high", tmp_path, pool="ws", priority=10, park_after="0s"),
        "low-a": demo("low-a", tmp_path, pool="ws", priority=1, park_after="0s"),
        "low-b": demo("low-b", tmp_path, pool="ws", priority=1, park_after="0s"),
    }
    async with warmgate(config(targets, pools=pools)) as wg, aiohttp.ClientSession() as client:
        for name in ("low-a", "high"):
            prompt_id, _ = await prompt(client, f"{wg.url}/{name}")
            await rendered(client, f"{wg.url}/{name}", prompt_id)
        await asyncio.sleep(1.0)  # both idle past yield_after; low-a the longer
        prompt_id, held = await prompt(client, wg.url + "/low-b")
        assert held is not None
        await rendered(client, wg.url + "/low-b", prompt_id)
        phases = {name: wg.runtime(name).state.phase for name in targets}
        assert phases == {"high": Phase.READY, "low-a": Phase.PARKED, "low-b": Phase.READY}
        assert wg.runtime("low-a").state.reason == "making room for low-b in its pool"
        displaced = await metric_value(
            wg.admin, "warmgate_pool_displacements_total", pool="ws", target="low-a", how="park"
        )
        assert displaced == 1
        assert await metric_value(wg.admin, "warmgate_pool_resident", pool="ws") == 2


async def test_a_request_waits_for_a_busy_pool_and_the_page_says_for_what(tmp_path: Path) -> None:
    pools = {"ws": {"capacity": 1, "yield_after": "300ms"}}
    targets = {
        "wan2gp": demo("wan2gp", tmp_path, pool="ws", render=4.0, park_after="0s"),
        "comfy": demo("comfy", tmp_path, pool="ws", park_after="0s"),
    }
    async with warmgate(config(targets, pools=pools)) as wg, aiohttp.ClientSession() as client:
        wan, comfy = wg.runtime("wan2gp"), wg.runtime("comfy")
        await prompt(client, wg.url + "/wan2gp")  # a 4-second render in the engine's queue
        await wait_until(lambda: wan.activity.busy_until > wan.loop.time(), timeout=10)
        held = asyncio.ensure_future(prompt(client, wg.url + "/comfy"))
        await wait_until(lambda: bool(comfy.state.waiting_for), timeout=10)
        assert comfy.state.waiting_for == "waiting for the GPU (ws): wan2gp is rendering"
        assert comfy.state.phase is Phase.COLD and not held.done()
        async with client.get(wg.url + "/comfy/", headers=PAGE) as resp:
            page = await resp.text()
        assert resp.status == 503 and "Waiting for the GPU (ws): wan2gp is rendering." in page
        _, waited = await held
        assert waited is not None and float(waited) > 1.0
        assert wan.state.phase is Phase.PARKED and comfy.state.phase is Phase.READY
        assert await metric_value(wg.admin, "warmgate_pool_waits_total", target="comfy") == 1


async def test_api_overflow_to_the_cloud_while_the_pool_is_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, CLOUD_KEY)
    cloud = FakeOpenAI(api_key=CLOUD_KEY, name="cloud")
    vllm = {
        "engine": "openai",
        "pool": "ws",
        "routes": [{"path_prefix": "/llm"}],
        "backend": {
            "kind": "process",
            "command": [sys.executable, "-m", "tests.fake_vllm", "--port", "{port}"],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"interval": "50ms"},
        "scaling": {"idle_after": "10m", "cold_start_timeout": "30s"},
    }
    async with serve_app(cloud.app()) as cloud_url:
        data = config(
            {"render": demo("render", tmp_path, pool="ws", render=5.0, park_after="0s"),
             "qwen": vllm},
            pools={"ws": {"capacity": 1, "yield_after": "10s"}},
            models={"qwen3-8b": {"placements": [
                {"target": "qwen"},
                {"cloud": "managed", "model": "frontier-large", "cost": PRICES}]}},
            clouds={"managed": {"base_url": cloud_url + "/v1", "api_key_env": KEY_ENV}},
            policy={"daily_cloud_budget_usd": 5, "max_wait": "10m"},
            api={"allow_anonymous": True},
        )  # fmt: skip
        async with warmgate(data) as wg, aiohttp.ClientSession() as client:
            await prompt(client, wg.url + "/render")  # the GPU renders for 5 s
            render = wg.runtime("render")
            await wait_until(lambda: render.activity.busy_until > render.loop.time(), timeout=10)
            api = openai.AsyncOpenAI(base_url=wg.url + "/v1", api_key="unused", max_retries=0)
            raw = await api.chat.completions.with_raw_response.create(
                model="qwen3-8b", messages=[{"role": "user", "content": "hi"}]
            )
            await api.close()
            assert raw.headers["x-warmgate-decision"] == "managed/frontier-large; reason=pool_busy"
            assert cloud.count("/v1/chat/completions") == 1
            assert wg.runtime("qwen").state.phase is Phase.COLD, "not started: the GPU is busy"


async def test_a_fake_vllm_is_parked_and_woken_through_its_sleep_mode() -> None:
    target = {
        "engine": "openai",
        "engine_options": {"sleep_mode": True},
        "routes": [{"path_prefix": "/"}],
        "backend": {
            "kind": "process",
            "command": [sys.executable, "-m", "tests.fake_vllm", "--port", "{port}"],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"interval": "50ms"},
        "scaling": {"park_after": "1s", "idle_after": "10m", "cold_start_timeout": "30s"},
    }
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    async with warmgate(config({"qwen": target})) as wg, aiohttp.ClientSession() as client:
        runtime = wg.runtime("qwen")
        async with client.post(wg.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
        endpoint = runtime.state.endpoints[0]
        await wait_until(lambda: parked(runtime), timeout=20)
        async with client.get(endpoint + "/_fake/sleep") as resp:
            asleep = await resp.json()
        assert asleep["sleeping"] == 1
        assert asleep["calls"][:2] == ["sleep?level=1", "is_sleeping"]
        async with client.post(wg.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, "woken before it was forwarded"
            assert resp.headers.get("X-Warmgate-Cold-Start") is not None
        async with client.get(endpoint + "/_fake/sleep") as resp:
            calls = (await resp.json())["calls"]
        assert "refused" not in calls
        assert calls[2:4] == ["wake_up", "is_sleeping"]
        assert runtime.state.phase is Phase.READY and runtime.state.endpoints[0] == endpoint


async def test_the_dashboard_shows_the_tier_and_the_pool_and_parks_on_demand(
    tmp_path: Path,
) -> None:
    (tmp_path / "admin-token").write_text("s3cret\n")
    auth = {"Authorization": "Bearer s3cret"}
    data = config(
        {"comfy": demo("comfy", tmp_path, park_after="5m", pool="ws")},
        pools={"ws": {"capacity": 1, "yield_after": "30s"}},
        admin={"token_file": "admin-token"},
    )
    async with warmgate(data, str(tmp_path)) as wg, aiohttp.ClientSession() as client:
        runtime = wg.runtime("comfy")
        prompt_id, _ = await prompt(client, wg.url + "/comfy")
        await rendered(client, wg.url + "/comfy", prompt_id)
        async with client.get(wg.admin + "/status") as resp:
            view = await resp.json()
        t = view["targets"]["comfy"]
        assert t["parked"]["parked"] is False and t["parked"]["park_after"] == 300
        assert t["park_at"] is not None and t["park_at"] < t["release_at"]
        assert view["pools"]["ws"]["resident"] == ["comfy"]
        async with client.post(wg.admin + "/targets/comfy/park", headers=auth) as resp:
            assert resp.status == 202, await resp.text()
        await wait_until(lambda: parked(runtime), timeout=20)
        async with client.get(wg.admin + "/status") as resp:
            view = await resp.json()
        assert view["targets"]["comfy"]["parked"]["parked"] is True
        assert view["pools"]["ws"] | {"members": None} == {
            "capacity": 1, "yield_after": 30.0, "resident": [], "parked": ["comfy"],
            "waiting": {}, "making_room": {}, "members": None,
        }  # fmt: skip
        async with client.post(wg.admin + "/targets/comfy/park", headers=auth) as resp:
            assert (resp.status, (await resp.json())["result"]) == (200, "already parked")
        async with client.get(wg.admin + "/") as resp:
            page = await resp.text()
        assert 'id="pool-ws"' in page and "parked since" in page
        kinds = [event["kind"] for event in view["events"]]
        assert "park" in kinds
