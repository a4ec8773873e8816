"""The demo engine's side of ComfyUI's web page: the routes the page reads beyond rendering
(node definitions, users, settings, user data) and the page itself from
``comfyui-frontend-package``; tests/engines/test_comfyui_page.py drives it in Chromium."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from pytest_aiohttp import AiohttpClient

from backends.demo_engine.config import KIB, EngineConfig
from backends.demo_engine.frontend import FrontendMissing, web_root
from backends.demo_engine.server import build_app

DEFAULT_GRAPH = {"CheckpointLoaderSimple", "CLIPTextEncode", "KSampler", "EmptyLatentImage",
                 "VAEDecode", "SaveImage"}  # fmt: skip
"""The node types of ComfyUI's default workflow, which the page builds on first load."""
INSTALLED = importlib.util.find_spec("comfyui_frontend_package") is not None


@pytest.fixture
def config(tmp_path: Path) -> EngineConfig:
    return EngineConfig(checkpoint_path=tmp_path / "ckpt.bin", checkpoint_size=64 * KIB)


async def test_the_page_s_api_answers_as_a_fresh_comfyui(
    aiohttp_client: AiohttpClient, config: EngineConfig
) -> None:
    client = await aiohttp_client(build_app(config))
    for prefix in ("", "/api"):
        nodes = await (await client.get(prefix + "/object_info")).json()
        assert set(nodes) >= DEFAULT_GRAPH
        sampler = nodes["KSampler"]
        assert sampler["input_order"]["required"][:2] == ["model", "seed"]
        assert sampler["output"] == ["LATENT"] and nodes["SaveImage"]["output_node"] is True
        assert (await (await client.get(prefix + "/users")).json())["storage"] == "server"
        assert await (await client.get(prefix + "/extensions")).json() == []

    assert (await client.post("/api/settings/Comfy.ColorPalette", json="light")).status == 200
    settings = await (await client.get("/api/settings")).json()
    assert settings["Comfy.ColorPalette"] == "light"
    assert await (await client.get("/api/settings/Comfy.ColorPalette")).json() == "light"

    listing = "/api/userdata?dir=workflows&recurse=true&split=false&full_info=true"
    assert (await client.get(listing)).status == 404, "no such directory yet, as ComfyUI says"
    saved = await client.post("/api/userdata/workflows%2Fa.json?full_info=true", data=b"{}")
    assert (await saved.json())["path"] == "workflows/a.json"
    files = await (await client.get(listing)).json()
    assert [f["path"] for f in files] == ["a.json"]
    assert await (await client.get("/api/userdata/workflows%2Fa.json")).read() == b"{}"
    again = await client.post("/api/userdata/workflows%2Fa.json?overwrite=false", data=b"[]")
    assert again.status == 409
    v2 = await (await client.get("/api/v2/userdata?path=")).json()
    assert v2 == [{"name": "workflows", "path": "workflows", "type": "directory"}]


async def test_the_builtin_page_unless_comfyui_s_is_asked_for(
    aiohttp_client: AiohttpClient, config: EngineConfig
) -> None:
    assert web_root("builtin") is None
    client = await aiohttp_client(build_app(config))
    assert 'src="static/app.js"' in await (await client.get("/")).text()


@pytest.mark.skipif(not INSTALLED, reason="comfyui-frontend-package is not installed")
async def test_comfyui_s_page_from_its_package(
    aiohttp_client: AiohttpClient, config: EngineConfig
) -> None:
    client = await aiohttp_client(build_app(dataclasses.replace(config, frontend="comfyui")))
    index = await client.get("/")
    assert index.headers["Cache-Control"] == "no-cache"
    assert "<title>ComfyUI</title>" in await index.text()
    assert (await client.get("/scripts/api.js")).status == 200  # its files, at the root
    assert (await client.get("/api/queue")).status == 200  # the API still before them


def test_asking_for_comfyui_s_page_without_its_package_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FrontendMissing, match="pip install comfyui-frontend-package"):
        web_root("comfyui")
    assert web_root("auto") is None, "auto: the builtin page"
