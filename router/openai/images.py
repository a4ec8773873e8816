"""``/v1/images/generations`` on a local ComfyUI target: fill the placement's workflow template,
submit it to ``/prompt``, follow it to completion (the ``/ws`` event stream, ``/history`` as the
fallback and the source of truth), fetch the outputs through ``/view``, answer ``b64_json``.

A render runs as its own task, so a client that gives up does not waste it: the client's retry
of the same request (``x-stainless-retry-count`` > 0, same body, same client key) joins the
running render, or takes its result if it finished moments ago, instead of starting a second one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp import web

from router.config import Placement
from router.errors import UpstreamError, UpstreamTimeout
from router.http.proxy import COLD_START_HEADER
from router.openai.call import Call
from router.openai.errors import InvalidRequest
from router.openai.fields import MAX_IMAGES, SIZE
from router.openai.local import api_facts
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.images")

RESULT_TTL: Final = 120.0
"""Seconds a finished render stays joinable by a client's retry (the SDK backs off up to 8 s
between tries, after a timeout that may end just before the render does)."""
HISTORY_POLL: Final = 0.25
"""Seconds between /history polls when the websocket is unavailable."""
HISTORY_CHECK: Final = 2.0
"""With the websocket open, /history is still asked this often (a missed event never hangs)."""
_PLACEHOLDER = re.compile(r"\$\{([a-z_]+)\}")


class RenderFailed(UpstreamError):
    code = "render_failed"


@dataclass(frozen=True, slots=True)
class Rendered:
    pngs: list[bytes]
    cold_wait: float | None
    """Seconds the render waited for its target's cold start (or wake); ``None``: it did not."""


def load_workflow(base_dir: str, path: str) -> dict[str, Any]:
    graph: dict[str, Any] = json.loads(Path(base_dir, path).read_text(encoding="utf-8"))
    return graph


def fill(template: object, values: Mapping[str, object]) -> Any:
    """The template with ``${name}`` replaced: a string that is exactly one placeholder takes
    the value with its type (numbers stay numbers); inside longer text, its string form.
    Values are never spliced into JSON text, so a prompt cannot alter the graph."""
    if isinstance(template, str):
        whole = _PLACEHOLDER.fullmatch(template)
        if whole and whole.group(1) in values:
            return values[whole.group(1)]
        return _PLACEHOLDER.sub(
            lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template
        )
    if isinstance(template, dict):
        return {k: fill(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, values) for v in template]
    return template


def image_values(body: Mapping[str, Any]) -> list[dict[str, object]]:
    """The template values of each image asked for (``n`` of them, consecutive seeds)."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequest("prompt: expected a non-empty string", param="prompt")
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_IMAGES:
        raise InvalidRequest(f"n: expected 1 to {MAX_IMAGES}", param="n")
    size = body.get("size") or "1024x1024"
    size = "1024x1024" if size == "auto" else size
    match = SIZE.match(size) if isinstance(size, str) else None
    if match is None:
        raise InvalidRequest("size: expected WIDTHxHEIGHT such as 1024x1024", param="size")
    seed = body.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        seed = random.randrange(2**32)
    negative = body.get("negative_prompt")
    base: dict[str, object] = {
        "prompt": prompt,
        "negative_prompt": negative if isinstance(negative, str) else "",
        "width": int(match.group(1)),
        "height": int(match.group(2)),
    }
    return [{**base, "seed": seed + i} for i in range(n)]


def _history_state(entry: Mapping[str, Any]) -> tuple[bool, str | None]:
    """(finished, error message) of one /history entry."""
    status = entry.get("status") or {}
    if status.get("status_str") == "error":
        for kind, data in status.get("messages") or []:
            if kind == "execution_error" and isinstance(data, dict):
                return True, str(data.get("exception_message") or "the render failed")
        return True, "the render failed"
    return bool(status.get("completed", True)), None


class ComfyImages:
    """Renders on ComfyUI targets, with retries of the same request joined."""

    def __init__(self, loads: Counter[str]) -> None:
        self.loads = loads
        self._renders: dict[str, asyncio.Task[Rendered]] = {}
        self._tasks: set[asyncio.Task[Rendered]] = set()

    def _key(self, call: Call) -> str:
        identity = call.client.digest or "-"
        return hashlib.sha256(identity.encode() + b"\0" + call.raw).hexdigest()

    async def generate(
        self,
        call: Call,
        runtime: TargetRuntime,
        session: aiohttp.ClientSession,
        placement: Placement,
        workflow: Mapping[str, Any],
    ) -> web.Response:
        values = image_values(call.body)
        key = self._key(call)
        retry = call.request.headers.get("x-stainless-retry-count", "0").strip()
        task = self._renders.get(key) if retry not in ("", "0") else None
        if task is not None and not task.cancelled():
            call.notes["joined"] = "1"
        else:
            coro = self._render_all(call.request_id, runtime, session, workflow, values)
            task = asyncio.get_running_loop().create_task(coro, name=f"render:{call.request_id}")
            self._renders[key] = task
            self._tasks.add(task)
            task.add_done_callback(lambda t: self._finished(key, t))
        rendered = await asyncio.shield(task)
        body = {
            "created": int(time.time()),
            "data": [{"b64_json": base64.b64encode(png).decode()} for png in rendered.pngs],
            "output_format": "png",
        }
        headers = {}
        if rendered.cold_wait is not None:  # a joined retry waited for that cold start too
            call.notes["cold_wait"] = f"{rendered.cold_wait:.3f}"
            headers[COLD_START_HEADER] = f"{rendered.cold_wait:.3f}"
        return web.json_response(body, headers=headers)

    def _finished(self, key: str, task: asyncio.Task[Rendered]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is not None:
            if self._renders.get(key) is task:
                del self._renders[key]
            return

        def forget() -> None:
            if self._renders.get(key) is task:
                del self._renders[key]

        asyncio.get_running_loop().call_later(RESULT_TTL, forget)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        self._renders.clear()

    async def _render_all(
        self,
        request_id: str,
        runtime: TargetRuntime,
        session: aiohttp.ClientSession,
        workflow: Mapping[str, Any],
        values: list[dict[str, object]],
    ) -> Rendered:
        name = runtime.name
        self.loads[name] += 1
        try:
            held = await runtime.acquire(api_facts("/prompt"))
            with runtime.in_flight():
                base = runtime.pick_endpoint(held.state)
                limit = runtime.spec.timeouts.response_headers
                try:
                    async with asyncio.timeout(limit):
                        graphs = [fill(workflow, v) for v in values]
                        outputs = await asyncio.gather(
                            *(self._render_one(session, base, name, g) for g in graphs)
                        )
                except TimeoutError:
                    raise UpstreamTimeout(
                        f"target {name!r} did not finish the render in {limit:g}s", target=name
                    ) from None
                except (aiohttp.ClientError, ValueError, KeyError) as exc:
                    raise UpstreamError(
                        f"target {name!r} broke the render exchange ({type(exc).__name__})",
                        target=name,
                    ) from exc
                log.info("%s: %d image(s) rendered on %s", request_id, len(values), name)
                pngs = [png for images in outputs for png in images]
                return Rendered(pngs, held.waited if held.cold else None)
        finally:
            self.loads[name] -= 1

    async def _render_one(
        self, session: aiohttp.ClientSession, base: str, target: str, graph: object
    ) -> list[bytes]:
        client_id = uuid.uuid4().hex
        ws: aiohttp.ClientWebSocketResponse | None = None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            ws = await session.ws_connect(f"{base}/ws?clientId={client_id}", autoping=True)
        try:
            prompt_id = await self._submit(session, base, target, graph, client_id)
            entry = await self._follow(session, base, prompt_id, ws)
        finally:
            if ws is not None:
                await ws.close()
        _, error = _history_state(entry)
        if error is not None:
            raise RenderFailed(f"target {target!r}: {error}", target=target)
        images = [
            image
            for output in (entry.get("outputs") or {}).values()
            for image in (output.get("images") or [])
            if isinstance(image, dict) and image.get("filename")
        ]
        if not images:
            raise RenderFailed(f"target {target!r}: the workflow produced no image", target=target)
        return [await self._view(session, base, image) for image in images]

    async def _submit(
        self, session: aiohttp.ClientSession, base: str, target: str, graph: object, cid: str
    ) -> str:
        payload = json.dumps({"prompt": graph, "client_id": cid}).encode()
        headers = {"Content-Type": "application/json"}
        async with session.post(f"{base}/prompt", data=payload, headers=headers) as response:
            answer = await response.json(content_type=None)
            if response.status != 200 or not isinstance(answer, dict):
                error = answer.get("error") if isinstance(answer, dict) else None
                message = error.get("message") if isinstance(error, dict) else None
                raise RenderFailed(
                    f"target {target!r} refused the workflow: {message or response.status}",
                    target=target,
                )
            return str(answer["prompt_id"])

    async def _history(
        self, session: aiohttp.ClientSession, base: str, prompt_id: str
    ) -> Mapping[str, Any] | None:
        async with session.get(f"{base}/history/{prompt_id}") as response:
            answer = await response.json(content_type=None)
        entry = answer.get(prompt_id) if isinstance(answer, dict) else None
        return entry if isinstance(entry, dict) else None

    async def _follow(
        self,
        session: aiohttp.ClientSession,
        base: str,
        prompt_id: str,
        ws: aiohttp.ClientWebSocketResponse | None,
    ) -> Mapping[str, Any]:
        """Wait until the prompt is done; returns its /history entry."""
        while True:
            if ws is not None and not ws.closed:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(HISTORY_CHECK):
                        await self._until_done(ws, prompt_id)
            else:
                await asyncio.sleep(HISTORY_POLL)
            entry = await self._history(session, base, prompt_id)
            if entry is not None and _history_state(entry)[0]:
                return entry

    async def _until_done(self, ws: aiohttp.ClientWebSocketResponse, prompt_id: str) -> None:
        async for message in ws:
            if message.type is not aiohttp.WSMsgType.TEXT:
                continue  # binary preview frames
            try:
                event = json.loads(message.data)
            except ValueError:
                continue
            data = event.get("data") if isinstance(event, dict) else None
            if not isinstance(data, dict) or data.get("prompt_id") != prompt_id:
                continue
            kind = event.get("type")
            if kind in ("execution_success", "execution_error", "execution_interrupted"):
                return
            if kind == "executing" and data.get("node") is None:
                return

    async def _view(
        self, session: aiohttp.ClientSession, base: str, image: Mapping[str, Any]
    ) -> bytes:
        query = {
            "filename": str(image["filename"]),
            "subfolder": str(image.get("subfolder") or ""),
            "type": str(image.get("type") or "output"),
        }
        async with session.get(f"{base}/view", params=query) as response:
            if response.status != 200:
                raise RenderFailed(f"/view answered {response.status} for {query['filename']}")
            return await response.read()
