"""HTTP routes and the app builder: a ComfyUI-compatible subset, every route also under /api/."""

from __future__ import annotations

import asyncio
import json
import logging
import platform
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from .checkpoint import Checkpoint, LoadState, Model
from .config import EngineConfig
from .device import describe_devices
from .execute import RenderExecutor
from .frontend import UserData, api_routes, page_routes, web_root
from .graph import PromptError, parse_prompt
from .history import History, OutputStore
from .hub import Hub, status_message
from .origin import origin_middleware
from .page import APP_CSS, APP_JS, INDEX_HTML
from .prompt_queue import PromptQueue

log = logging.getLogger(__name__)

CONFIG = web.AppKey("config", EngineConfig)
MODEL: web.AppKey[Model] = web.AppKey("model")
OUTPUTS = web.AppKey("outputs", OutputStore)
HUB = web.AppKey("hub", Hub)
QUEUE = web.AppKey("queue", PromptQueue)
TORCH: web.AppKey[Any] = web.AppKey("torch")
"""The torch module when the checkpoint lives on CUDA, else None."""

PREFIXES = ("", "/api")
"""ComfyUI serves its API both at the root and under /api/."""


async def readyz(request: web.Request) -> web.Response:
    """200 once the engine can serve: the checkpoint loaded, or parked (``POST /free``: it loads
    again on the next render, and the engine stays ready, as a Kubernetes readinessProbe needs)."""
    model = request.app[MODEL]
    if model.state is LoadState.LOADED:
        return web.json_response({"status": "ready"})
    if model.state in (LoadState.PARKED, LoadState.RELOADING):
        return web.json_response({"status": "ready", "checkpoint": model.state.value})
    # ``stage`` as the ComfyUI image's /readyz node says it: "failed" tells warmgate that the
    # start cannot succeed as it is (it fails at once, with ``error`` as the reason).
    failed = model.state is LoadState.FAILED
    body: dict[str, Any] = {
        "status": "loading",
        "stage": "failed" if failed else "loading",
        "checkpoint": model.state.value,
    }
    if model.progress is not None:  # warmgate's waiting page shows it (docs/engines.md)
        body["progress"] = round(model.progress, 4)
    if model.error:
        body["error"] = model.error
    return web.json_response(body, status=503)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def _bad_request(error: PromptError) -> web.Response:
    return web.json_response(error.as_json(), status=400)


async def post_prompt(request: web.Request) -> web.Response:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _bad_request(PromptError("invalid_json", f"Request body is not JSON: {exc}"))
    try:
        parsed = parse_prompt(body, request.app[CONFIG].steps)
    except PromptError as exc:
        return _bad_request(exc)
    client_id = body.get("client_id")
    item = await request.app[QUEUE].put(parsed, client_id if isinstance(client_id, str) else None)
    log.info("queued prompt %s (#%d)", item.prompt_id, item.number)
    return web.json_response(
        {"prompt_id": item.prompt_id, "number": item.number, "node_errors": {}}
    )


async def get_prompt(request: web.Request) -> web.Response:
    return web.json_response({"exec_info": {"queue_remaining": request.app[QUEUE].remaining}})


async def get_queue(request: web.Request) -> web.Response:
    return web.json_response(request.app[QUEUE].snapshot())


async def get_history(request: web.Request) -> web.Response:
    history = request.app[QUEUE].history
    prompt_id = request.match_info.get("prompt_id")
    if prompt_id is not None:
        return web.json_response(history.get(prompt_id))
    raw = request.query.get("max_items")
    max_items = int(raw) if raw and raw.isdigit() else None
    return web.json_response(history.all(max_items))


async def view(request: web.Request) -> web.Response:
    q = request.query
    png = request.app[OUTPUTS].get(
        q.get("filename", ""), q.get("subfolder", ""), q.get("type", "output")
    )
    if png is None:
        raise web.HTTPNotFound()
    return web.Response(body=png, content_type="image/png")


async def free(request: web.Request) -> web.Response:
    """ComfyUI's ``POST /free``: ``unload_models`` drops the resident checkpoint (with
    ``--device cuda`` its VRAM goes back to the driver); the next render loads it again."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        return web.json_response({"error": "expected a JSON object"}, status=400)
    if body.get("unload_models") or body.get("free_memory"):
        await request.app[MODEL].park()
    return web.Response(status=200)


async def system_stats(request: web.Request) -> web.Response:
    torch = request.app[TORCH]
    model = request.app[MODEL]
    ram, devices = describe_devices(torch)
    system = {
        "os": sys.platform,
        **ram,
        "comfyui_version": "demo",
        "python_version": sys.version,
        "pytorch_version": str(getattr(torch, "__version__", "")),
        "embedded_python": False,
        "argv": sys.argv,
        "hostname": platform.node(),
    }
    checkpoint = {
        "state": model.state.value,
        "resident_bytes": model.resident_bytes,
        "device": "cuda" if torch is not None else "cpu",
    }
    return web.json_response({"system": system, "devices": devices, "checkpoint": checkpoint})


async def websocket(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(heartbeat=30)
    await ws.prepare(request)
    sid = request.query.get("clientId") or uuid.uuid4().hex
    hub = request.app[HUB]
    await ws.send_json(status_message(request.app[QUEUE].remaining, sid))
    hub.add(ws, sid)
    try:
        async for msg in ws:  # clients may send; ComfyUI ignores most of it, and so do we
            if msg.type == WSMsgType.ERROR:
                break
    finally:
        hub.remove(ws)
    return ws


def _text(body: str, content_type: str) -> Callable[[web.Request], Any]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type=content_type, charset="utf-8")

    return handler


def _routes(root: Path | None) -> list[web.AbstractRouteDef]:
    """The API at ``/`` and under ``/api/``, then the page: the builtin one, or ComfyUI's
    (``root``: its files, served last, as ComfyUI serves them)."""
    table: list[tuple[str, str, Any]] = [
        ("GET", "/readyz", readyz),
        ("GET", "/healthz", healthz),
        ("POST", "/prompt", post_prompt),
        ("GET", "/prompt", get_prompt),
        ("GET", "/queue", get_queue),
        ("GET", "/history", get_history),
        ("GET", "/history/{prompt_id}", get_history),
        ("GET", "/view", view),
        ("GET", "/system_stats", system_stats),
        ("POST", "/free", free),
        ("GET", "/ws", websocket),
        *api_routes(UserData()),
    ]
    routes: list[web.AbstractRouteDef] = [
        web.get(prefix + path, handler)
        if method == "GET"
        else web.route(method, prefix + path, handler)
        for prefix in PREFIXES
        for method, path, handler in table
    ]
    if root is not None:
        return routes + page_routes(root)
    builtin = [
        ("/", _text(INDEX_HTML, "text/html")),
        ("/static/app.css", _text(APP_CSS, "text/css")),
        ("/static/app.js", _text(APP_JS, "application/javascript")),
    ]
    return routes + [web.get(p + path, handler) for p in PREFIXES for path, handler in builtin]


async def _background(app: web.Application) -> AsyncIterator[None]:
    """Start the checkpoint load (when eager) and the queue worker; stop both on shutdown."""
    model = app[MODEL]
    if app[CONFIG].eager_load:
        model.start()
    worker = asyncio.get_running_loop().create_task(app[QUEUE].run(), name="demo-engine-worker")
    yield
    worker.cancel()
    await asyncio.wait({worker})
    await model.aclose()


async def _close_sockets(app: web.Application) -> None:
    await app[HUB].close_all()


def build_app(
    config: EngineConfig, model: Model | None = None, torch: Any = None
) -> web.Application:
    """Wire the engine; `model` defaults to the real checkpoint described by `config`."""
    if model is None:
        model = Checkpoint(
            config.checkpoint_path,
            config.checkpoint_size,
            chunk_size=config.chunk_size,
            torch=torch,
            load_seconds=config.load_seconds,
        )
    app = web.Application(middlewares=[origin_middleware], client_max_size=16 * 1024**2)
    hub = Hub()
    outputs = OutputStore(config.output_limit)
    executor = RenderExecutor(model, outputs, hub, config.render_seconds)
    app[CONFIG] = config
    app[MODEL] = model
    app[OUTPUTS] = outputs
    app[HUB] = hub
    app[QUEUE] = PromptQueue(executor, hub.broadcast_status, History(config.history_limit))
    app[TORCH] = torch
    app.add_routes(_routes(web_root(config.frontend)))
    app.cleanup_ctx.append(_background)
    app.on_shutdown.append(_close_sockets)
    return app
