"""Reading a ComfyUI API-format prompt graph into render parameters; pure functions only.

The graph maps node ids to `{"class_type", "inputs"}`. The engine needs only a few values:
the positive text (CLIPTextEncode), seed and steps (KSampler), size (EmptyLatentImage) and the
output node (SaveImage/PreviewImage). Missing nodes fall back to defaults; present values of
the wrong type or range are rejected the way ComfyUI rejects them, with per-node errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TEXT = "a warm gate at dawn"
DEFAULT_SIZE = 512
SIZE_RANGE = (16, 2048)
STEPS_RANGE = (1, 1000)
SEED_RANGE = (0, 2**64 - 1)
SAMPLER_NODE = "3"
SAVE_NODE = "9"
"""Node ids of ComfyUI's default workflow, used when the graph lacks those nodes."""
OUTPUT_CLASSES = frozenset({"SaveImage", "PreviewImage"})


class PromptError(ValueError):
    """The request cannot be queued; carries ComfyUI's error shape."""

    def __init__(
        self, kind: str, message: str, node_errors: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.node_errors: dict[str, Any] = dict(node_errors or {})

    def as_json(self) -> dict[str, Any]:
        error = {"type": self.kind, "message": self.message, "details": "", "extra_info": {}}
        return {"error": error, "node_errors": self.node_errors}


@dataclass(frozen=True, slots=True)
class ParsedPrompt:
    """What the engine takes from one graph."""

    graph: dict[str, Any]
    text: str
    seed: int
    steps: int
    width: int
    height: int
    filename_prefix: str
    sampler_node: str
    output_node: str
    order: list[str] = field(default_factory=list)
    """Node ids in execution order (dependencies first), including the two virtual ones."""


def _nodes(graph: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Nodes that look like nodes; anything else in the graph is ignored."""
    return {
        str(k): v
        for k, v in graph.items()
        if isinstance(v, dict) and isinstance(v.get("class_type"), str)
    }


def _inputs(node: Mapping[str, Any] | None) -> dict[str, Any]:
    raw = node.get("inputs") if node else None
    return raw if isinstance(raw, dict) else {}


def _first(nodes: Mapping[str, dict[str, Any]], *classes: str) -> str | None:
    return next((k for k, v in nodes.items() if v["class_type"] in classes), None)


def _link(value: Any) -> str | None:
    """The source node id of a link input `[node_id, output_index]`, else None."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
        return str(value[0])
    return None


def _node_error(node_id: str, class_type: str, key: str, kind: str, message: str) -> PromptError:
    detail = {
        "type": kind,
        "message": message,
        "details": f"{key}",
        "extra_info": {"input_name": key},
    }
    return PromptError(
        "prompt_outputs_failed_validation",
        "Prompt outputs failed validation",
        {node_id: {"errors": [detail], "dependent_outputs": [], "class_type": class_type}},
    )


def _int_input(
    nodes: Mapping[str, dict[str, Any]],
    node_id: str | None,
    key: str,
    default: int,
    bounds: tuple[int, int],
) -> int:
    if node_id is None:
        return default
    value = _inputs(nodes[node_id]).get(key)
    class_type = nodes[node_id]["class_type"]
    if value is None or _link(value) is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise _node_error(node_id, class_type, key, "invalid_input_type", f"{key}: not an int")
    lo, hi = bounds
    if value < lo:
        raise _node_error(node_id, class_type, key, "value_smaller_than_min", f"{key} < {lo}")
    if value > hi:
        raise _node_error(node_id, class_type, key, "value_bigger_than_max", f"{key} > {hi}")
    return int(value)


def execution_order(nodes: Mapping[str, dict[str, Any]]) -> list[str]:
    """Dependencies before dependants, otherwise graph order; cycles are appended as found."""
    deps = {
        k: {src for v in _inputs(n).values() if (src := _link(v)) is not None and src in nodes}
        for k, n in nodes.items()
    }
    order: list[str] = []
    done: set[str] = set()
    while len(order) < len(nodes):
        ready = [k for k in nodes if k not in done and deps[k] <= done]
        batch = ready[:1] or [next(k for k in nodes if k not in done)]
        order.extend(batch)
        done.update(batch)
    return order


def parse_prompt(body: Any, default_steps: int) -> ParsedPrompt:
    """Validate a POST /prompt body's graph; raises PromptError with ComfyUI's error shape."""
    if not isinstance(body, dict) or "prompt" not in body:
        raise PromptError("no_prompt", "No prompt provided")
    graph = body["prompt"]
    if not isinstance(graph, dict):
        raise PromptError("invalid_prompt", "Prompt must be an object of node id -> node")
    nodes = _nodes(graph)
    sampler = _first(nodes, "KSampler", "KSamplerAdvanced")
    latent = _first(nodes, "EmptyLatentImage")
    output = _first(nodes, *OUTPUT_CLASSES)
    positive = _link(_inputs(nodes.get(sampler or "")).get("positive"))
    text_node = positive if positive in nodes else _first(nodes, "CLIPTextEncode")
    text = _inputs(nodes.get(text_node or "")).get("text")
    prefix = _inputs(nodes.get(output or "")).get("filename_prefix")
    order = execution_order(nodes)
    for virtual, real in ((SAMPLER_NODE, sampler), (SAVE_NODE, output)):
        if real is None and virtual not in order:
            order.append(virtual)
    return ParsedPrompt(
        graph=graph,
        text=text if isinstance(text, str) else DEFAULT_TEXT,
        seed=_int_input(nodes, sampler, "seed", 0, SEED_RANGE),
        steps=_int_input(nodes, sampler, "steps", default_steps, STEPS_RANGE),
        width=_int_input(nodes, latent, "width", DEFAULT_SIZE, SIZE_RANGE),
        height=_int_input(nodes, latent, "height", DEFAULT_SIZE, SIZE_RANGE),
        filename_prefix=prefix if isinstance(prefix, str) and prefix else "ComfyUI",
        sampler_node=sampler or SAMPLER_NODE,
        output_node=output or SAVE_NODE,
        order=order,
    )
