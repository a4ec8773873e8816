"""``engine: comfyui``: ComfyUI (and warmgate's demo engine, which speaks its API).

- **Ready**: ``GET /system_stats`` answers 200; then, with ``warmup_workflow``, that API-format
  graph is queued and the target counts as ready once it completed (the checkpoint is resident
  before the first user render, even on an engine that loads lazily).
- **Busy**: ComfyUI's own queue, ``GET /prompt`` -> ``exec_info.queue_remaining > 0``. A render
  keeps the target active with no HTTP traffic at all. ``queue_remaining`` (the prompts waiting
  and the one running) is also the queue depth the API policy reads.
- **Streams**: a tab's ``/ws`` carries status and progress for as long as the tab is open; its
  frames are not activity (the queue is the busy signal).
- **Wakes**: a page load, a frontend asset, ``POST /prompt`` and ``POST /upload/...``; not the
  API reads a tab makes in the background (``/queue``, ``/history``, ``/system_stats``,
  ``/object_info``, ``/view``, ..., and their ``/api/`` aliases), even asked with ``Accept:
  text/html`` (a browser gets the waiting page, no start), nor its websocket reconnecting.
- **Parks** (``park: auto``): ``POST /free`` with ``{"unload_models": true, "free_memory":
  true}`` (ComfyUI unloads its models and frees the cache); waking needs no call, the models load
  on the next prompt, and with ``warmup_workflow`` the warm-up runs again on every wake.

Every API route also exists under ``/api/`` (the current frontend's relative ``api/...`` URLs),
so the UI works behind a stripped path prefix.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Final

import aiohttp
from yarl import URL

from backends.base import RequestFacts, StreamActivity
from backends.engines.common import (
    PROBE_ERRORS,
    SAFE_METHODS,
    WARMUP_REQUEST_TIMEOUT,
    EngineBase,
    Warmup,
    WarmupFailed,
)
from backends.outside import count
from backends.specs import EngineCall, EngineSpec, ParkRequests

API_ROUTES: Final = frozenset(
    {
        "prompt",
        "queue",
        "history",
        "interrupt",
        "free",
        "system_stats",
        "object_info",
        "embeddings",
        "models",
        "features",
        "view",
        "view_metadata",
        "upload",
        "users",
        "userdata",
        "v2",
        "settings",
        "i18n",
        "internal",
        "experiment",
        "workflow_templates",
        "ws",
    }
)
"""First path segments of ComfyUI's API (also served under ``/api/``). ``/extensions`` is API
only on its own; ``/extensions/<node>/...`` are a custom node's frontend files."""

WAKING_POSTS: Final = ("prompt", "upload/image", "upload/mask")
"""API requests that are someone working: queueing a render, uploading an input image."""

WARMUP_CLIENT_ID: Final = "warmgate-warmup"

FREE: Final = ParkRequests(
    request=EngineCall(path="/free", json_body={"unload_models": True, "free_memory": True})
)
"""ComfyUI's own park action: unload every model and free the memory; no wake call."""


def api_route(path: str) -> str | None:
    """The API route of an upstream path without its ``/api/`` form (``prompt``,
    ``history/abc``), or ``None`` for the frontend's files."""
    rest = path.lstrip("/")
    if rest == "api" or rest.startswith("api/"):
        return rest[4:]
    head = rest.split("/", 1)[0]
    if head == "extensions":
        return rest if rest.rstrip("/") == "extensions" else None
    return rest if head in API_ROUTES else None


def load_workflow(path: str) -> dict[str, Any]:
    graph = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(graph, dict):
        raise ValueError(f"{path}: expected an API-format graph (an object of nodes)")
    return graph


def prompt_error(body: Any, status: int) -> str:
    """ComfyUI's answer to a rejected prompt, in one line."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = str(body["error"].get("message") or body["error"])
        nodes = body.get("node_errors")
        return f"{message} {json.dumps(nodes)}" if nodes else message
    return f"POST /prompt answered {status}"


def history_outcome(entry: Any) -> str | None:
    """``None`` while the prompt has not finished; ``"success"``, or the error message."""
    if not isinstance(entry, dict):
        return None
    status = entry.get("status")
    if not isinstance(status, dict):
        return "success" if entry.get("outputs") is not None else None
    if status.get("status_str") == "success" or (
        status.get("completed") and status.get("status_str") != "error"
    ):
        return "success"
    if status.get("status_str") != "error":
        return None
    for kind, data in status.get("messages") or ():
        if kind == "execution_error" and isinstance(data, dict):
            node = data.get("node_type") or data.get("node_id")
            return f"{data.get('exception_message', 'error')} (node {node})"
    return "the workflow failed"


class ComfyUIEngine(EngineBase):
    default_ready_path = "/system_stats"

    def __init__(self, spec: EngineSpec) -> None:
        super().__init__(spec)
        self.workflow: dict[str, Any] | None = None
        if spec.warmup_workflow is not None:
            self.workflow = load_workflow(spec.warmup_workflow)
            self.warmup = Warmup("comfyui", self._warm_up)

    async def _warm_up(self, base_url: str) -> None:
        """Queue the warm-up workflow and wait for it in /history (no websocket needed)."""
        body = {"prompt": self.workflow, "client_id": WARMUP_CLIENT_ID}
        timeout = aiohttp.ClientTimeout(total=WARMUP_REQUEST_TIMEOUT)
        async with self.client().post(base_url + "/prompt", json=body, timeout=timeout) as reply:
            try:
                answer = await reply.json(content_type=None)
            except ValueError:
                answer = None
            if reply.status != 200 or not isinstance(answer, dict):
                raise WarmupFailed(prompt_error(answer, reply.status))
        prompt_id = str(answer.get("prompt_id"))
        while True:
            await asyncio.sleep(self.readiness.interval)
            history = await self.get_json(base_url, f"/history/{prompt_id}")
            outcome = history_outcome(history.get(prompt_id) if isinstance(history, dict) else None)
            if outcome == "success":
                return
            if outcome is not None:
                raise WarmupFailed(outcome)

    def auto_park(self) -> ParkRequests:
        return FREE

    async def busy(self, base_url: str) -> bool:
        return await self.busy_from(self._queue_remaining(base_url))

    async def _queue_remaining(self, base_url: str) -> bool | None:
        try:
            body = await self.get_json(base_url, "/prompt")
            said = body["exec_info"]["queue_remaining"]
        except (*PROBE_ERRORS, KeyError, TypeError):
            return self.heard_queue(base_url, None)
        depth = count(said)
        if depth is None:
            self.refused(base_url, "queue_remaining", said)
        return self.heard_queue(base_url, depth)

    def is_read(self, facts: RequestFacts) -> bool:
        # Every API route (its /api/ alias too: /api/readyz, the node's) read with a GET: a
        # tab's background poll, a monitor, a bookmark; the frontend's files are pages.
        return facts.method in SAFE_METHODS and api_route(facts.path) is not None

    def request_wakes(self, facts: RequestFacts) -> bool:
        route = api_route(facts.path)
        if route is None:
            return True  # the frontend's files: only a page load fetches them
        return facts.method == "POST" and route.rstrip("/") in WAKING_POSTS

    def stream_activity(self, path: str) -> StreamActivity:
        return "none" if path.rstrip("/").endswith("/ws") else "frames"

    def websocket_again(self, path: str, first_message: str) -> str:
        """ComfyUI's page opens its first socket as plain ``/ws`` and learns its client id from
        the first ``status`` frame's ``sid``; a new process asked with ``?clientId=`` keeps it
        (server.py: the query's, else a new uuid). A socket that sent one keeps its own."""
        url = URL(path, encoded=True)
        if url.query.get("clientId"):
            return path
        try:
            message = json.loads(first_message)
            sid = message["data"]["sid"] if message["type"] == "status" else None
        except (ValueError, KeyError, TypeError):
            return path
        if not isinstance(sid, str) or not sid:
            return path
        return str(url.extend_query(clientId=sid))
