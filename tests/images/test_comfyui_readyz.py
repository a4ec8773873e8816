"""warmgate's ComfyUI custom node (deploy/images/comfyui/warmgate_readyz), loaded the way ComfyUI
loads a custom node, against a stand-in of the ComfyUI modules it touches (comfyui_standin/: the
server's route table, folder_paths, the checkpoint loader, model management) with a real aiohttp
server on 127.0.0.1 and real checkpoint files."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "deploy/images/comfyui/warmgate_readyz"
STANDIN = Path(__file__).resolve().parent / "comfyui_standin"
STANDIN_MODULES = (
    "server",
    "nodes",
    "folder_paths",
    "comfy",
    "comfy.sd",
    "comfy.model_patcher",
    "comfy.model_management",
)
CHECKPOINT = b"stand-in checkpoint\n" + bytes(4096)


def forget(names: Any) -> None:
    for name in list(sys.modules):
        if any(name == n or name.startswith(n + ".") for n in names):
            del sys.modules[name]


@dataclass
class ComfyUI:
    """One ComfyUI process: the stand-in modules, the loaded custom node, the listening server."""

    url: str
    node: ModuleType
    nodes: ModuleType
    sd: ModuleType
    model_management: ModuleType

    async def readyz(self, path: str = "/readyz") -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as session, session.get(self.url + path) as resp:
            return resp.status, await resp.json()

    async def until(self, check: Callable[[int, dict[str, Any]], bool]) -> dict[str, Any]:
        """Poll /readyz until ``check(status, body)``; bounded."""
        deadline = time.monotonic() + 10
        while True:
            status, body = await self.readyz()
            if check(status, body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"/readyz never matched; last {status} {body}")
            await asyncio.sleep(0.01)

    async def render(self, ckpt_name: str) -> tuple[Any, Any, Any]:
        """What a workflow's CheckpointLoaderSimple -> CLIPTextEncode -> KSampler -> VAEDecode
        asks of the loader and of model management, on a worker thread like ComfyUI's."""

        def run() -> tuple[Any, Any, Any]:
            loader = self.nodes.NODE_CLASS_MAPPINGS["CheckpointLoaderSimple"]()
            model, clip, vae = getattr(loader, loader.FUNCTION)(ckpt_name=ckpt_name)
            self.model_management.load_model_gpu(clip.patcher)
            self.model_management.load_models_gpu([model], memory_required=1 << 30)
            self.model_management.load_models_gpu([vae.patcher])
            return model, clip, vae

        return await asyncio.to_thread(run)


@pytest.fixture
async def comfyui(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., Any]]:
    checkpoints = tmp_path / "models/checkpoints"
    (checkpoints / "sdxl").mkdir(parents=True)
    (checkpoints / "sdxl/juggernaut.safetensors").write_bytes(CHECKPOINT)
    (checkpoints / "flux1-schnell.safetensors").write_bytes(CHECKPOINT)
    (checkpoints / "broken.safetensors").write_bytes(b"not a checkpoint")
    (checkpoints / "oom.safetensors").write_bytes(CHECKPOINT)
    forget(STANDIN_MODULES)
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.delenv("EAGER_LOAD_MODEL", raising=False)
    monkeypatch.delenv("EAGER_CHECKPOINTS", raising=False)
    started: list[tuple[Any, str]] = []

    async def start(gated: bool = False, **env: str) -> ComfyUI:
        import comfy.model_management
        import comfy.sd
        import folder_paths
        import nodes
        import server

        for key, value in env.items():
            monkeypatch.setenv(key, value)
        folder_paths.add_model_folder_path("checkpoints", str(checkpoints))
        if gated:
            comfy.sd.gate = threading.Semaphore(0)
            comfy.model_management.gate = threading.Semaphore(0)
        prompt_server = server.PromptServer(asyncio.get_running_loop())
        name = f"warmgate_readyz_{uuid.uuid4().hex}"
        started.append((prompt_server, name))
        assert nodes.load_custom_node(str(NODE), module_name=name)
        prompt_server.add_routes()
        await prompt_server.start_multi_address([("127.0.0.1", 0)])
        return ComfyUI(
            url=f"http://127.0.0.1:{prompt_server.port}",
            node=sys.modules[name],
            nodes=nodes,
            sd=comfy.sd,
            model_management=comfy.model_management,
        )

    yield start

    for module_name in ("comfy.sd", "comfy.model_management"):
        gate = getattr(sys.modules.get(module_name), "gate", None)
        if gate is not None:
            gate.release(100)
    for thread in threading.enumerate():
        if thread.name == "warmgate-eager-load":
            await asyncio.to_thread(thread.join, 10)
            assert not thread.is_alive()
    for prompt_server, name in started:
        await prompt_server.stop()
        forget([name])
    forget(STANDIN_MODULES)


async def test_loading_reports_progress_then_200_once_resident(comfyui: Any) -> None:
    comfy = await comfyui(
        gated=True,
        EAGER_LOAD_MODEL="1",
        EAGER_CHECKPOINTS="sdxl/juggernaut.safetensors, flux1-schnell.safetensors",
    )
    names = ["sdxl/juggernaut.safetensors", "flux1-schnell.safetensors"]
    status, body = await comfy.readyz()
    assert status == 503
    assert body == {
        "stage": "loading",
        "progress": 0.0,
        "loaded": [],
        "eager": True,
        "checkpoints": names,
        "loading": "sdxl/juggernaut.safetensors",
    }
    assert comfy.sd.calls == [] and comfy.model_management.moved == []

    comfy.sd.gate.release()  # read from the share; now waiting to move into VRAM
    body = await comfy.until(lambda s, b: b["progress"] == 0.25)
    assert (body["stage"], body["loaded"]) == ("loading", [])
    comfy.model_management.gate.release()  # model, CLIP and VAE moved in one call
    body = await comfy.until(lambda s, b: b["progress"] == 0.5)
    assert body["loaded"] == ["sdxl/juggernaut.safetensors"]
    assert body["loading"] == "flux1-schnell.safetensors"
    assert len(comfy.model_management.moved) == 3

    comfy.sd.gate.release()
    await comfy.until(lambda s, b: b["progress"] == 0.75)
    comfy.model_management.gate.release()
    body = await comfy.until(lambda s, b: s == 200)
    assert body == {
        "stage": "ready",
        "progress": 1.0,
        "loaded": names,
        "eager": True,
        "resident": names,
    }
    assert [Path(p).name for p in comfy.sd.calls] == ["juggernaut.safetensors", names[1]]
    # ComfyUI serves every route of the table under /api as well.
    assert await comfy.readyz("/api/readyz") == (200, body)


async def test_a_render_after_the_eager_load_loads_nothing(comfyui: Any) -> None:
    comfy = await comfyui(EAGER_LOAD_MODEL="1", EAGER_CHECKPOINTS="sdxl/juggernaut.safetensors")
    await comfy.until(lambda s, b: s == 200)
    reads, moved = list(comfy.sd.calls), list(comfy.model_management.moved)
    assert len(reads) == 1 and len(moved) == 3

    model, clip, vae = await comfy.render("sdxl/juggernaut.safetensors")
    assert comfy.sd.calls == reads, "the checkpoint was read again"
    assert comfy.model_management.moved == moved, "something was moved into VRAM again"
    assert [model, clip.patcher, vae.patcher] == moved  # the very objects loaded at start

    # Another checkpoint still loads the ordinary way.
    await comfy.render("flux1-schnell.safetensors")
    assert len(comfy.sd.calls) == 2 and len(comfy.model_management.moved) == 6


async def test_resident_says_what_model_management_still_holds(comfyui: Any) -> None:
    comfy = await comfyui(EAGER_LOAD_MODEL="1", EAGER_CHECKPOINTS="flux1-schnell.safetensors")
    body = await comfy.until(lambda s, b: s == 200)
    assert body["resident"] == ["flux1-schnell.safetensors"]
    comfy.model_management.unload_all_models()  # ComfyUI's /free, or memory pressure
    status, body = await comfy.readyz()
    assert status == 200, "reloaded on use: still ready"
    assert (body["loaded"], body["resident"]) == (["flux1-schnell.safetensors"], [])


async def test_a_render_during_the_eager_load_waits_for_it(comfyui: Any) -> None:
    comfy = await comfyui(
        gated=True, EAGER_LOAD_MODEL="1", EAGER_CHECKPOINTS="sdxl/juggernaut.safetensors"
    )
    render = asyncio.create_task(comfy.render("sdxl/juggernaut.safetensors"))
    await asyncio.sleep(0.05)
    assert not render.done()
    comfy.sd.gate.release()
    comfy.model_management.gate.release()
    model, _clip, _vae = await asyncio.wait_for(render, 10)
    assert len(comfy.sd.calls) == 1 and comfy.model_management.moved[0] is model


@pytest.mark.parametrize("value", [None, "0", "false", ""])
async def test_without_eager_load_ready_as_soon_as_the_server_is_up(
    comfyui: Any, value: str | None
) -> None:
    env = {} if value is None else {"EAGER_LOAD_MODEL": value}
    comfy = await comfyui(EAGER_CHECKPOINTS="sdxl/juggernaut.safetensors", **env)
    for path in ("/readyz", "/api/readyz"):
        assert await comfy.readyz(path) == (
            200,
            {"stage": "ready", "progress": 1.0, "loaded": [], "eager": False, "resident": []},
        )
    assert not [t for t in threading.enumerate() if t.name == "warmgate-eager-load"]
    assert comfy.sd.calls == []
    model, clip, vae = await comfy.render("sdxl/juggernaut.safetensors")  # loads on demand
    assert len(comfy.sd.calls) == 1
    assert comfy.model_management.moved == [clip.patcher, model, vae.patcher]


@pytest.mark.parametrize(
    ("checkpoints", "error"),
    [
        (
            "sdxl/juggernaut.safetensors,missing.safetensors",
            "missing.safetensors: FileNotFoundError: Model in folder 'checkpoints' with "
            "filename 'missing.safetensors' not found.",
        ),
        ("broken.safetensors", "broken.safetensors: RuntimeError: ERROR: Could not detect"),
        ("oom.safetensors", "oom.safetensors: RuntimeError: CUDA out of memory"),
    ],
)
async def test_a_failed_load_stays_503_with_the_error_in_body_and_log(
    comfyui: Any, caplog: pytest.LogCaptureFixture, checkpoints: str, error: str
) -> None:
    caplog.set_level(logging.INFO, logger="warmgate.readyz")
    comfy = await comfyui(EAGER_LOAD_MODEL="1", EAGER_CHECKPOINTS=checkpoints)
    body = await comfy.until(lambda s, b: b["stage"] == "failed")
    for thread in threading.enumerate():
        if thread.name == "warmgate-eager-load":
            await asyncio.to_thread(thread.join, 10)
    status, body = await comfy.readyz()
    assert status == 503 and body["stage"] == "failed"
    assert body["error"].startswith(error)
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 1 and error in failures[0].getMessage()
    assert failures[0].exc_info is not None, "the traceback goes to the log"
    assert (await comfy.readyz("/api/readyz"))[0] == 503


@pytest.mark.parametrize(
    ("env", "error"),
    [
        ({"EAGER_LOAD_MODEL": "1"}, "EAGER_LOAD_MODEL=1 but EAGER_CHECKPOINTS names no checkpoint"),
        (
            {"EAGER_LOAD_MODEL": "please", "EAGER_CHECKPOINTS": "flux1-schnell.safetensors"},
            "EAGER_LOAD_MODEL='please': expected 1 or 0",
        ),
    ],
)
async def test_settings_that_cannot_be_honoured_are_never_200(
    comfyui: Any, env: dict[str, str], error: str
) -> None:
    comfy = await comfyui(**env)
    status, body = await comfy.readyz()
    assert (status, body["stage"], body["error"]) == (503, "failed", error)
    assert comfy.sd.calls == []
