"""/v1/images/generations on a local ComfyUI-compatible target (the demo engine as a process
that cold-starts for real), through the real ``openai`` client; retries join the running render."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from router.openai.errors import InvalidRequest
from router.openai.images import fill, image_values
from router.scale.state import Phase
from tests.helpers import ROOT, demo_engine
from tests.openai_stack import Stack, cloud_key, stack

__all__ = ["cloud_key"]
pytestmark = pytest.mark.usefixtures("cloud_key")

WORKFLOW = "deploy/local/workflows/flux_dev.json"


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def with_comfyui(tmp: Path, max_wait: str = "60s") -> Any:
    def tweak(config: dict[str, Any]) -> None:
        config["targets"]["comfyui"] = {
            "routes": [{"path_prefix": "/"}],
            "backend": {
                "kind": "process",
                "command": demo_engine(checkpoint=tmp / "ckpt.bin"),
                "cwd": str(ROOT),
                "stop_grace": "2s",
            },
            "readiness": {"path": "/readyz", "interval": "50ms"},
            "scaling": {"cold_start_timeout": "60s"},
        }
        config["models"]["flux-dev"] = {
            "kind": "images",
            "max_wait": max_wait,
            "placements": [
                {"target": "comfyui", "workflow": WORKFLOW},
                {"cloud": "managed", "model": "image-large", "cost": {"per_image": 0.04}},
            ],
        }

    return tweak


async def engine_history(st: Stack) -> dict[str, Any]:
    endpoint = st.wg.runtime("comfyui").state.endpoints[0]
    async with aiohttp.ClientSession() as http, http.get(endpoint + "/history") as resp:
        result: dict[str, Any] = await resp.json()
    return result


async def test_images_render_on_the_local_engine(tmp_path: Path) -> None:
    async with stack(tweak=with_comfyui(tmp_path)) as st:
        client = st.client(timeout=60)
        raw = await client.images.with_raw_response.generate(
            model="flux-dev", prompt='a "warm" gate}', size="64x48", n=2
        )
        assert raw.headers["x-warmgate-decision"] == "comfyui; reason=cold_within_budget"
        waited = float(raw.headers["x-warmgate-cold-start"])  # it waited for the cold start
        assert waited > 0
        images = raw.parse()
        assert len(images.data) == 2
        pngs = [base64.b64decode(d.b64_json or "") for d in images.data]
        assert [png_size(png) for png in pngs] == [(64, 48), (64, 48)]
        assert pngs[0] != pngs[1]  # consecutive seeds
        history = await engine_history(st)
        assert len(history) == 2
        graphs = [entry["prompt"][2] for entry in history.values()]
        assert {g["6"]["inputs"]["text"] for g in graphs} == {'a "warm" gate}'}
        seeds = sorted(g["3"]["inputs"]["seed"] for g in graphs)
        assert seeds[1] == seeds[0] + 1 and isinstance(seeds[0], int)
        assert st.cloud.requests == []
        again = await client.images.with_raw_response.generate(
            model="flux-dev", prompt="warm now", size="32x32"
        )
        assert "x-warmgate-cold-start" not in again.headers, "no wait: no header"
        await client.close()


async def test_a_client_retry_joins_the_running_render(tmp_path: Path) -> None:
    async with stack(tweak=with_comfyui(tmp_path)) as st:
        warm = st.client(timeout=60)
        await warm.images.generate(model="flux-dev", prompt="warm up", size="32x32")
        await warm.close()
        assert st.wg.runtime("comfyui").state.phase is Phase.READY
        before = len(await engine_history(st))
        asked = await st.decisions(model="flux-dev")

        # The SDK gives up after 0.1 s (the render takes 0.2 s) and retries the same body with
        # x-stainless-retry-count: 1, 2: the retries join the first render.
        client = st.client(timeout=0.1, max_retries=5)
        images = await client.images.generate(
            model="flux-dev", prompt="once only", size="32x32", extra_body={"seed": 7}
        )
        assert png_size(base64.b64decode(images.data[0].b64_json or "")) == (32, 32)
        assert len(await engine_history(st)) == before + 1
        assert await st.decisions(model="flux-dev") >= asked + 2  # it did time out and retry
        await client.close()

        # a new request (not a retry) with the same body is a new render
        async with aiohttp.ClientSession() as http:
            body = {"model": "flux-dev", "prompt": "once only", "size": "32x32", "seed": 7}
            async with http.post(st.wg.url + "/v1/images/generations", json=body) as resp:
                assert resp.status == 200
        assert len(await engine_history(st)) == before + 2


async def test_a_retry_from_another_client_key_does_not_join(tmp_path: Path) -> None:
    async with stack(tweak=with_comfyui(tmp_path)) as st:
        body = {"model": "flux-dev", "prompt": "mine", "size": "32x32", "seed": 1}
        async with aiohttp.ClientSession() as http:

            async def post(key: str, retry: str) -> int:
                headers = {"Authorization": f"Bearer {key}", "x-stainless-retry-count": retry}
                async with http.post(
                    st.wg.url + "/v1/images/generations", json=body, headers=headers
                ) as resp:
                    await resp.read()
                    return resp.status

            assert await asyncio.gather(post("alice", "0"), post("bob", "1")) == [200, 200]
        assert len(await engine_history(st)) == 2


async def test_bad_image_requests_are_400(tmp_path: Path) -> None:
    async with stack(tweak=with_comfyui(tmp_path)) as st:
        client = st.client()
        with pytest.raises(openai.BadRequestError) as info:
            await client.images.generate(model="flux-dev", prompt="x", size="huge")  # type: ignore[arg-type]
        assert info.value.param == "size"
        await client.close()
        assert st.wg.runtime("comfyui").state.phase is Phase.COLD


def test_the_template_is_filled_with_typed_values_never_spliced() -> None:
    template = json.loads((ROOT / WORKFLOW).read_text())
    values = image_values({"prompt": 'say "}, {"evil": 1', "size": "640x480", "seed": 5})[0]
    graph = fill(template, values)
    assert graph["6"]["inputs"]["text"] == 'say "}, {"evil": 1'
    assert graph["3"]["inputs"]["seed"] == 5
    assert graph["5"]["inputs"] == {"width": 640, "height": 480, "batch_size": 1}
    assert graph["7"]["inputs"]["text"] == ""
    assert fill({"a": "seed=${seed}, ${unknown}"}, {"seed": 3}) == {"a": "seed=3, ${unknown}"}
    with pytest.raises(InvalidRequest):
        image_values({"prompt": "x", "n": 11})
    with pytest.raises(InvalidRequest):
        image_values({"prompt": ""})
