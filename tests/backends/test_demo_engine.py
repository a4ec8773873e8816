"""Tests for backends.demo_engine: real loopback servers, a real subprocess, short renders."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from backends.demo_engine.checkpoint import Checkpoint, LoadState, create_file
from backends.demo_engine.config import (
    KIB,
    MIB,
    EngineConfig,
    default_checkpoint_path,
    format_size,
    parse_config,
    parse_size,
)
from backends.demo_engine.graph import PromptError, parse_prompt
from backends.demo_engine.origin import origin_allowed
from backends.demo_engine.png import SIGNATURE, decode_size, encode_rgb
from backends.demo_engine.render import RenderSpec, final_png
from backends.demo_engine.server import build_app

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 15.0


# --- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture(autouse=True)
async def no_pending_tasks() -> AsyncIterator[None]:
    """Every test must leave the loop clean: no task of ours still pending."""
    yield
    await asyncio.sleep(0)
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert not left, f"tasks left pending: {left}"


@pytest.fixture
def config(tmp_path: Path) -> EngineConfig:
    return EngineConfig(
        checkpoint_path=tmp_path / "ckpt.bin",
        checkpoint_size=256 * KIB,
        render_seconds=0.2,
        steps=4,
        chunk_size=32 * KIB,
    )


class GatedModel:
    """A fake twin of Checkpoint whose load finishes only when the test opens the gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.error: str | None = None
        self.progress: float | None = None
        self._state = LoadState.UNLOADED
        self._task: asyncio.Task[None] | None = None

    @property
    def state(self) -> LoadState:
        return self._state

    def start(self) -> None:
        if self._task is None:
            self._state = LoadState.LOADING
            self._task = asyncio.get_running_loop().create_task(self._load())

    async def _load(self) -> None:
        await self.gate.wait()
        self._state = LoadState.LOADED

    async def ensure_loaded(self) -> None:
        self.start()
        assert self._task is not None
        await asyncio.shield(self._task)

    def sample(self, offset: int, length: int) -> bytes:
        return bytes(length)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})


def graph(
    text: str = "a red fox", seed: int = 7, steps: int = 4, w: int = 96, h: int = 64
) -> dict[str, Any]:
    """ComfyUI's default text-to-image workflow in API format."""
    return {
        "3": {
            "class_type": "KSampler",
            "inputs": {
                "seed": seed,
                "steps": steps,
                "positive": ["6", 0],
                "negative": ["7", 0],
                "model": ["4", 0],
                "latent_image": ["5", 0],
            },
        },
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "demo.safetensors"}},
        "5": {
            "class_type": "EmptyLatentImage",
            "inputs": {"width": w, "height": h, "batch_size": 1},
        },
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": text, "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "test", "images": ["8", 0]}},
    }


async def collect(
    ws: aiohttp.ClientWebSocketResponse, prompt_id: str
) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Websocket messages until the prompt succeeds or fails; JSON and binary frames apart."""
    messages: list[dict[str, Any]] = []
    frames: list[bytes] = []
    async with asyncio.timeout(TIMEOUT):
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                frames.append(msg.data)
                continue
            assert msg.type == WSMsgType.TEXT, msg
            message = json.loads(msg.data)
            messages.append(message)
            done = message["type"] in ("execution_success", "execution_error")
            if done and message["data"]["prompt_id"] == prompt_id:
                break
    return messages, frames


async def poll(probe: Callable[[], Awaitable[T]], ok: Callable[[T], bool]) -> T:
    """Call `probe` until `ok` accepts its result; fail after TIMEOUT seconds."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            value = await probe()
            if ok(value):
                return value
            await asyncio.sleep(0.01)


async def get_json(client: TestClient[Any, Any], path: str) -> Any:
    return await (await client.get(path)).json()


async def wait_for_history(client: TestClient[Any, Any], prompt_id: str) -> dict[str, Any]:
    body = await poll(lambda: get_json(client, f"/history/{prompt_id}"), bool)
    return body[prompt_id]  # type: ignore[no-any-return]


def png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Check every chunk's CRC and return (width, height, raw scanlines)."""
    assert data[:8] == SIGNATURE
    pos, idat, size = 8, b"", (0, 0)
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, payload = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + payload) & 0xFFFFFFFF
        if kind == b"IHDR":
            size = struct.unpack(">II", payload[:8])
            assert payload[8:10] == b"\x08\x02"
        elif kind == b"IDAT":
            idat += payload
        pos += 12 + length
    return size[0], size[1], zlib.decompress(idat)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- pure pieces ------------------------------------------------------------------------------


def test_png_encoder_round_trips() -> None:
    rows = [b"".join(bytes([x, y, x ^ y]) for x in range(5)) for y in range(3)]
    png = encode_rgb(5, 3, rows)
    width, height, raw = png_pixels(png)
    assert (width, height) == (5, 3) == decode_size(png)
    assert raw == b"".join(b"\x00" + r for r in rows)


def test_render_is_deterministic_and_sized() -> None:
    spec = RenderSpec("a red fox", 7, 4, 96, 64, salt=b"abc")
    png = final_png(spec)
    assert png == final_png(spec)
    assert png != final_png(RenderSpec("a red fox", 8, 4, 96, 64, salt=b"abc"))
    width, height, raw = png_pixels(png)
    assert (width, height) == (96, 64) and len(raw) == 64 * (1 + 96 * 3)


def test_parse_prompt_reads_comfy_graph_and_defaults() -> None:
    g = graph("a blue bird", seed=123, steps=6, w=128, h=80)
    g = {"7": g["7"], **{k: v for k, v in g.items() if k != "7"}}  # negative text comes first
    parsed = parse_prompt({"prompt": g}, default_steps=10)
    assert (parsed.text, parsed.seed, parsed.steps) == ("a blue bird", 123, 6)
    assert (parsed.width, parsed.height, parsed.output_node) == (128, 80, "9")
    assert parsed.order.index("3") > parsed.order.index("6") and parsed.order[-1] == "9"
    lenient = parse_prompt({"prompt": {}}, default_steps=10)
    assert (lenient.steps, lenient.width, lenient.sampler_node, lenient.order) == (
        10,
        512,
        "3",
        ["3", "9"],
    )
    with pytest.raises(PromptError) as err:
        parse_prompt({"prompt": graph(w=99999)}, default_steps=10)
    assert err.value.kind == "prompt_outputs_failed_validation" and "5" in err.value.node_errors
    with pytest.raises(PromptError):
        parse_prompt({"client_id": "x"}, default_steps=10)


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        (None, "127.0.0.1:8188", True),
        ("http://127.0.0.1:8188", "127.0.0.1:8188", True),
        ("http://LOCALHOST", "localhost:80", True),
        ("https://example.com", "example.com", True),
        ("http://127.0.0.1:9999", "127.0.0.1:8188", False),
        ("http://evil.example", "127.0.0.1:8188", False),
        ("null", "127.0.0.1:8188", False),
    ],
)
def test_origin_rule(origin: str | None, host: str, allowed: bool) -> None:
    assert origin_allowed(origin, host) is allowed


def test_config_flags_then_env_then_defaults(tmp_path: Path) -> None:
    env = {
        "XDG_CACHE_HOME": str(tmp_path),
        "DEMO_CHECKPOINT_SIZE": "1MiB",
        "DEMO_RENDER_SECONDS": "0.5",
        "EAGER_LOAD_MODEL": "0",
    }
    cfg = parse_config(["--port", "9000"], env)
    assert (cfg.port, cfg.checkpoint_size, cfg.render_seconds, cfg.eager_load) == (
        9000,
        MIB,
        0.5,
        False,
    )
    assert cfg.checkpoint_path == tmp_path / "warmgate" / "demo-checkpoint-1MiB.bin"
    cfg = parse_config(["--checkpoint-size", "2k", "--render-seconds", "3"], env)
    assert (cfg.checkpoint_size, cfg.render_seconds) == (2048, 3.0)
    assert parse_config([], {"HOME": str(tmp_path)}).checkpoint_path == (
        tmp_path / ".cache" / "warmgate" / "demo-checkpoint-256MiB.bin"
    )
    assert parse_size("256MiB") == 256 * MIB and format_size(1000) == "1000B"
    assert default_checkpoint_path({"XDG_CACHE_HOME": "/c"}, 3 * MIB).name == (
        "demo-checkpoint-3MiB.bin"
    )
    with pytest.raises(SystemExit):
        parse_config([], {"EAGER_LOAD_MODEL": "maybe"})


# --- checkpoint -------------------------------------------------------------------------------


async def test_checkpoint_is_deterministic_and_resident(tmp_path: Path) -> None:
    a, b = tmp_path / "a.bin", tmp_path / "b" / "b.bin"
    assert create_file(a, 100 * KIB, 7 * KIB, threading.Event())
    assert not create_file(a, 100 * KIB, 7 * KIB, threading.Event())  # already there
    create_file(b, 100 * KIB, 64 * KIB, threading.Event())
    assert a.read_bytes() == b.read_bytes() and len(set(a.read_bytes()[:4096])) > 200
    ckpt = Checkpoint(a, 100 * KIB, chunk_size=7 * KIB)
    states = [ckpt.state]
    await ckpt.ensure_loaded()
    states.append(ckpt.state)
    assert ckpt.sample(10, 16) == a.read_bytes()[10:26]
    await ckpt.aclose()
    states.append(ckpt.state)
    assert states == [LoadState.UNLOADED, LoadState.LOADED, LoadState.UNLOADED]


async def test_checkpoint_load_can_be_cancelled(tmp_path: Path) -> None:
    ckpt = Checkpoint(tmp_path / "big.bin", 64 * MIB, chunk_size=64 * KIB)
    ckpt.start()
    await asyncio.sleep(0.01)
    await ckpt.aclose()
    assert ckpt.state is LoadState.UNLOADED
    # the writer thread stops at the next chunk and removes its temporary file
    await poll(lambda: asyncio.to_thread(lambda: list(tmp_path.iterdir())), lambda f: not f)


# --- the HTTP and websocket API ---------------------------------------------------------------


async def test_readyz_only_after_load(aiohttp_client: AiohttpClient, config: EngineConfig) -> None:
    model = GatedModel()
    client = await aiohttp_client(build_app(config, model))
    assert (await client.get("/healthz")).status == 200
    resp = await client.get("/readyz")
    assert resp.status == 503 and (await resp.json())["status"] == "loading"
    model.gate.set()
    resp = await poll(lambda: client.get("/readyz"), lambda r: r.status == 200)
    assert await resp.json() == {"status": "ready"}


async def test_a_failed_load_says_failed_as_the_readyz_node_does(
    aiohttp_client: AiohttpClient, config: EngineConfig, tmp_path: Path
) -> None:
    (tmp_path / "not-a-dir").write_text("")  # the checkpoint cannot be made under a file
    broken = dataclasses.replace(config, checkpoint_path=tmp_path / "not-a-dir" / "ckpt.bin")
    client = await aiohttp_client(build_app(broken))
    answer = await poll(lambda: get_json(client, "/readyz"), lambda a: a["stage"] != "loading")
    assert answer["stage"] == "failed" and answer["checkpoint"] == "failed"
    assert "not-a-dir" in answer["error"]
    assert (await client.get("/readyz")).status == 503


async def test_lazy_load_happens_on_first_prompt(
    aiohttp_client: AiohttpClient, config: EngineConfig
) -> None:
    lazy = dataclasses.replace(config, eager_load=False)
    client = await aiohttp_client(build_app(lazy))
    await asyncio.sleep(0.1)
    assert (await client.get("/readyz")).status == 503
    assert not lazy.checkpoint_path.exists()
    resp = await client.post("/prompt", json={"prompt": graph(steps=2)})
    entry = await wait_for_history(client, (await resp.json())["prompt_id"])
    assert entry["status"]["status_str"] == "success"
    assert (await client.get("/readyz")).status == 200
    assert lazy.checkpoint_path.stat().st_size == lazy.checkpoint_size


async def test_prompt_round_trip_over_websocket(
    aiohttp_client: AiohttpClient, config: EngineConfig
) -> None:
    client = await aiohttp_client(build_app(config))
    async with (
        client.ws_connect("/ws?clientId=me") as ws,
        client.ws_connect("/ws?clientId=other") as other,
    ):
        hello = await ws.receive_json()
        assert hello == {
            "type": "status",
            "data": {"status": {"exec_info": {"queue_remaining": 0}}, "sid": "me"},
        }
        assert (await other.receive_json())["data"]["sid"] == "other"
        resp = await client.post("/prompt", json={"prompt": graph(w=96, h=64), "client_id": "me"})
        assert resp.status == 200
        body = await resp.json()
        pid = body["prompt_id"]
        assert body["node_errors"] == {} and isinstance(body["number"], int)
        messages, frames = await collect(ws, pid)

        kinds = [m["type"] for m in messages]
        assert kinds[0] == "status" and messages[0]["data"]["status"]["exec_info"] == {
            "queue_remaining": 1
        }
        assert kinds.index("execution_start") < kinds.index("progress") < kinds.index("executed")
        progress = [m["data"] for m in messages if m["type"] == "progress"]
        assert [(p["value"], p["max"], p["node"], p["prompt_id"]) for p in progress] == [
            (i, 4, "3", pid) for i in range(1, 5)
        ]
        executing = [m["data"]["node"] for m in messages if m["type"] == "executing"]
        assert executing[-1] is None and "3" in executing and "9" in executing
        assert kinds[-2:] == ["executing", "execution_success"]
        executed = next(m["data"] for m in messages if m["type"] == "executed")
        assert executed["node"] == "9" and executed["prompt_id"] == pid
        image = executed["output"]["images"][0]
        assert image["filename"].endswith(".png") and image["type"] == "output"

        assert frames, "expected at least one binary preview frame"
        for frame in frames:
            assert struct.unpack(">II", frame[:8]) == (1, 2)
            assert frame[8:16] == SIGNATURE
            assert png_pixels(frame[8:])[:2] == (64, 43)

        history = (await (await client.get(f"/history/{pid}")).json())[pid]
        assert history["outputs"] == {"9": {"images": [image]}}
        assert history["status"]["status_str"] == "success" and history["status"]["completed"]
        assert history["prompt"][1] == pid
        assert pid in await (await client.get("/history")).json()

        view = await client.get("/view", params=image)
        assert view.status == 200 and view.content_type == "image/png"
        assert png_pixels(await view.read())[:2] == (96, 64)
        assert (await client.get("/view", params={"filename": "nope.png"})).status == 404

        # the other client got the status broadcasts but none of my execution messages
        seen = []
        with contextlib.suppress(TimeoutError):
            while True:
                seen.append((await other.receive(timeout=0.1)).json()["type"])
        assert seen and set(seen) == {"status"}


async def test_prompt_without_client_id_reaches_every_socket(
    aiohttp_client: AiohttpClient, config: EngineConfig
) -> None:
    client = await aiohttp_client(build_app(config))
    async with client.ws_connect("/ws") as ws:
        assert len((await ws.receive_json())["data"]["sid"]) == 32
        pid = (await (await client.post("/prompt", json={"prompt": graph(steps=2)})).json())[
            "prompt_id"
        ]
        messages, _ = await collect(ws, pid)
        assert "progress" in {m["type"] for m in messages}


async def test_queue_remaining_counts_running_and_pending(
    aiohttp_client: AiohttpClient, config: EngineConfig
) -> None:
    slow = dataclasses.replace(config, render_seconds=0.5)
    client = await aiohttp_client(build_app(slow))
    ids = []
    for seed in (1, 2):
        resp = await client.post("/api/prompt", json={"prompt": graph(seed=seed)})
        ids.append((await resp.json())["prompt_id"])
    assert await (await client.get("/prompt")).json() == {"exec_info": {"queue_remaining": 2}}
    queue = await poll(lambda: get_json(client, "/queue"), lambda q: bool(q["queue_running"]))
    assert [row[1] for row in queue["queue_running"]] == ids[:1]
    assert [row[1] for row in queue["queue_pending"]] == ids[1:]
    assert queue["queue_running"][0][2] == graph(seed=1)
    for pid in ids:
        await wait_for_history(client, pid)
    assert await (await client.get("/api/prompt")).json() == {"exec_info": {"queue_remaining": 0}}
    assert await (await client.get("/queue")).json() == {"queue_running": [], "queue_pending": []}


async def test_bad_prompt_posts_get_400(
    aiohttp_client: AiohttpClient, config: EngineConfig
) -> None:
    client = await aiohttp_client(build_app(config))
    cases: list[tuple[bytes | str, str]] = [
        (b"{not json", "invalid_json"),
        (json.dumps({"client_id": "x"}), "no_prompt"),
        (json.dumps({"prompt": "text"}), "invalid_prompt"),
        (json.dumps({"prompt": graph(steps=0)}), "prompt_outputs_failed_validation"),
    ]
    for data, kind in cases:
        resp = await client.post("/prompt", data=data, headers={"Content-Type": "application/json"})
        assert resp.status == 400
        body = await resp.json()
        assert body["error"]["type"] == kind and body["error"]["message"]
        assert "node_errors" in body
    assert await (await client.get("/prompt")).json() == {"exec_info": {"queue_remaining": 0}}


async def test_api_prefix_aliases(aiohttp_client: AiohttpClient, config: EngineConfig) -> None:
    client = await aiohttp_client(build_app(config))
    # eager loading runs in the background; compare the aliases once the weights are resident
    await poll(lambda: client.get("/readyz"), lambda r: r.status == 200)
    for path in ("/readyz", "/healthz", "/prompt", "/queue", "/history", "/system_stats", "/"):
        plain, api = await client.get(path), await client.get("/api" + path)
        assert plain.status == api.status == 200
    stats = await (await client.get("/api/system_stats")).json()
    assert stats["system"]["comfyui_version"] == "demo"
    assert stats["system"]["embedded_python"] is False
    assert stats["devices"][0]["type"] == "cpu" and stats["devices"][0]["vram_total"] > 0
    async with client.ws_connect("/api/ws?clientId=a") as ws:
        assert (await ws.receive_json())["type"] == "status"
    pid = (await (await client.post("/api/prompt", json={"prompt": graph(steps=1)})).json())[
        "prompt_id"
    ]
    await wait_for_history(client, pid)
    image = (await (await client.get(f"/api/history/{pid}")).json())[pid]["outputs"]["9"]
    resp = await client.get("/api/view", params=image["images"][0])
    assert resp.status == 200 and (await resp.read())[:8] == SIGNATURE


async def test_origin_mismatch_is_forbidden(
    aiohttp_client: AiohttpClient, config: EngineConfig
) -> None:
    client = await aiohttp_client(build_app(config))
    own = f"http://127.0.0.1:{client.port}"
    evil = {"Origin": "http://evil.example"}
    assert (await client.get("/queue", headers=evil)).status == 403
    assert (await client.post("/prompt", json={"prompt": {}}, headers=evil)).status == 403
    assert (await client.get("/queue", headers={"Origin": own})).status == 200
    assert (await client.get("/queue")).status == 200
    with pytest.raises(aiohttp.WSServerHandshakeError) as err:
        await client.ws_connect("/ws", headers=evil)
    assert err.value.status == 403
    async with client.ws_connect("/ws", headers={"Origin": own}) as ws:
        assert (await ws.receive_json())["type"] == "status"
    assert await (await client.get("/prompt")).json() == {"exec_info": {"queue_remaining": 0}}


async def test_page_and_assets_use_relative_urls(
    aiohttp_client: AiohttpClient, config: EngineConfig
) -> None:
    client = await aiohttp_client(build_app(config))
    page = await client.get("/")
    assert page.status == 200 and page.content_type == "text/html"
    html = await page.text()
    assert 'href="static/app.css"' in html and 'src="static/app.js"' in html
    assert 'href="/' not in html and 'src="/' not in html and "http" not in html
    css = await client.get("/static/app.css")
    assert css.status == 200 and css.content_type == "text/css"
    js = await (await client.get("/static/app.js")).text()
    assert "new URL('ws', location.href)" in js
    assert "fetch('prompt'" in js and "'view?'" in js and "'history/'" in js
    assert "'/" not in js and '"/' not in js


# --- the real process ------------------------------------------------------------------------


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """`python -m backends.demo_engine` with a tiny checkpoint; killed if a test leaves it."""
    port = free_port()
    log = tmp_path / "engine.log"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "EAGER_LOAD_MODEL": "1"}
    cmd = [
        sys.executable,
        "-m",
        "backends.demo_engine",
        "--port",
        str(port),
        "--checkpoint-size",
        "2MiB",
        "--render-seconds",
        "3",
        "--steps",
        "30",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc, port, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_subprocess_serves_then_exits_zero_on_sigterm(
    engine: tuple[subprocess.Popen[bytes], int, Path], tmp_path: Path
) -> None:
    proc, port, log = engine
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        async with asyncio.timeout(TIMEOUT):
            while True:
                assert proc.poll() is None, log.read_text()
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with session.get(f"{base}/readyz") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.05)
        checkpoint = tmp_path / "cache" / "warmgate" / "demo-checkpoint-2MiB.bin"
        assert checkpoint.stat().st_size == 2 * MIB
        async with session.ws_connect(f"{base}/ws?clientId=t") as ws:
            await ws.receive_json()
            body = {"prompt": graph(steps=30), "client_id": "t"}
            async with session.post(f"{base}/prompt", json=body) as resp:
                assert resp.status == 200
            async with asyncio.timeout(TIMEOUT):
                while (await ws.receive_json())["type"] != "progress":
                    pass
            proc.send_signal(signal.SIGTERM)  # mid-render, with a socket open
            async with asyncio.timeout(TIMEOUT):
                while (await ws.receive()).type not in (WSMsgType.CLOSE, WSMsgType.CLOSED):
                    pass
    rc = await asyncio.to_thread(proc.wait, TIMEOUT)
    assert rc == 0, log.read_text()
    assert "demo engine stopped" in log.read_text()


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_cuda_without_torch_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "backends.demo_engine", "--port", "1", "--device", "cuda"],
        cwd=REPO,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 2
    assert "--device cuda needs PyTorch" in result.stderr
    assert not (tmp_path / "warmgate").exists()
