"""Running one prompt: wait for the model, walk the graph's nodes, render, store the output.

Messages follow ComfyUI's websocket protocol and go only to the submitting client (or to
everyone when the prompt had no client_id).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from .checkpoint import CheckpointError, Model
from .history import HistoryEntry, OutputStore
from .prompt_queue import QueuedPrompt
from .render import RenderSpec, render

log = logging.getLogger(__name__)

SALT_BYTES = 16
"""How many bytes of the checkpoint flavour each image."""


class EventSink(Protocol):
    async def send_json(self, kind: str, data: dict[str, Any], client_id: str | None) -> None: ...

    async def send_preview(self, png: bytes, client_id: str | None) -> None: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


class RenderExecutor:
    """The queue's Executor for the demo engine."""

    def __init__(
        self, model: Model, outputs: OutputStore, sink: EventSink, render_seconds: float
    ) -> None:
        self._model = model
        self._outputs = outputs
        self._sink = sink
        self._seconds = render_seconds

    async def execute(self, item: QueuedPrompt) -> HistoryEntry:
        pid, cid, parsed = item.prompt_id, item.client_id, item.parsed
        entry = HistoryEntry(row=item.row())

        async def send(kind: str, data: dict[str, Any], record: bool = False) -> None:
            if record:
                entry.messages.append([kind, data])
            await self._sink.send_json(kind, data, cid)

        await send("execution_start", {"prompt_id": pid, "timestamp": _now_ms()}, record=True)
        await send("execution_cached", {"nodes": [], "prompt_id": pid, "timestamp": _now_ms()})

        async def on_step(step: int, total: int, preview: bytes | None) -> None:
            node = parsed.sampler_node
            await send("progress", {"value": step, "max": total, "prompt_id": pid, "node": node})
            if preview is not None:
                await self._sink.send_preview(preview, cid)

        node = parsed.order[0] if parsed.order else parsed.sampler_node
        try:
            await self._model.ensure_loaded()
            spec = RenderSpec(
                text=parsed.text,
                seed=parsed.seed,
                steps=parsed.steps,
                width=parsed.width,
                height=parsed.height,
                salt=self._model.sample(parsed.seed, SALT_BYTES),
            )
            png: bytes | None = None
            for node in parsed.order:
                await send("executing", {"node": node, "display_node": node, "prompt_id": pid})
                if node in (parsed.sampler_node, parsed.output_node) and png is None:
                    png = await render(spec, self._seconds, on_step)
                if node == parsed.output_node and png is not None:
                    ref = self._outputs.add(parsed.filename_prefix, png)
                    output = {"images": [ref.as_json()]}
                    entry.outputs[node] = output
                    executed = {"node": node, "display_node": node, "output": output}
                    await send("executed", {**executed, "prompt_id": pid})
        except CheckpointError as exc:
            log.warning("prompt %s failed: %s", pid, exc)
            entry.success = False
            entry.messages.append(["execution_error", self._error(item, node, exc)])
        return entry

    def _error(self, item: QueuedPrompt, node: str, exc: Exception) -> dict[str, Any]:
        graph_node = item.parsed.graph.get(node)
        class_type = graph_node.get("class_type") if isinstance(graph_node, dict) else None
        return {
            "prompt_id": item.prompt_id,
            "node_id": node,
            "node_type": class_type or "",
            "executed": [],
            "exception_message": str(exc),
            "exception_type": type(exc).__name__,
            "traceback": [],
            "current_inputs": {},
            "current_outputs": {},
            "timestamp": _now_ms(),
        }

    async def announce_done(self, item: QueuedPrompt, entry: HistoryEntry) -> None:
        pid, cid = item.prompt_id, item.client_id
        if not entry.success:
            error = entry.messages[-1][1] if entry.messages else {"prompt_id": pid}
            await self._sink.send_json("execution_error", error, cid)
        await self._sink.send_json("executing", {"node": None, "prompt_id": pid}, cid)
        if entry.success:
            success = {"prompt_id": pid, "timestamp": _now_ms()}
            entry.messages.append(["execution_success", success])
            await self._sink.send_json("execution_success", success, cid)
