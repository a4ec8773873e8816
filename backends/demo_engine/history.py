"""Finished prompts and the images they produced, both kept in memory and bounded."""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class ImageRef:
    """How ComfyUI names an output image in messages, history and /view."""

    filename: str
    subfolder: str = ""
    type: str = "output"

    def as_json(self) -> dict[str, str]:
        return {"filename": self.filename, "subfolder": self.subfolder, "type": self.type}


class OutputStore:
    """The last `limit` rendered PNGs, by filename; the oldest is forgotten first."""

    def __init__(self, limit: int) -> None:
        self._limit = max(1, limit)
        self._images: OrderedDict[str, bytes] = OrderedDict()
        self._counter = 0

    def add(self, prefix: str, png: bytes) -> ImageRef:
        """Store a PNG under the next ComfyUI-style name, e.g. `ComfyUI_00001_.png`."""
        self._counter += 1
        safe = _UNSAFE.sub("_", prefix.rsplit("/", 1)[-1]).strip("._") or "ComfyUI"
        ref = ImageRef(f"{safe}_{self._counter:05d}_.png")
        self._images[ref.filename] = png
        while len(self._images) > self._limit:
            self._images.popitem(last=False)
        return ref

    def get(self, filename: str, subfolder: str = "", kind: str = "output") -> bytes | None:
        if subfolder or kind != "output":
            return None
        return self._images.get(filename)

    def __len__(self) -> int:
        return len(self._images)


@dataclass(slots=True)
class HistoryEntry:
    """One finished prompt, shaped like an entry of ComfyUI's /history."""

    row: list[Any]
    """The queue row: [number, prompt_id, graph, extra_data, outputs_to_execute]."""
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    success: bool = True
    messages: list[list[Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "prompt": self.row,
            "outputs": self.outputs,
            "status": {
                "status_str": "success" if self.success else "error",
                "completed": self.success,
                "messages": self.messages,
            },
            "meta": {node: {"node_id": node, "display_node": node} for node in self.outputs},
        }


class History:
    """Finished prompts by id, oldest first, at most `limit` of them."""

    def __init__(self, limit: int) -> None:
        self._limit = max(1, limit)
        self._entries: OrderedDict[str, HistoryEntry] = OrderedDict()

    def add(self, prompt_id: str, entry: HistoryEntry) -> None:
        self._entries[prompt_id] = entry
        while len(self._entries) > self._limit:
            self._entries.popitem(last=False)

    def get(self, prompt_id: str) -> dict[str, Any]:
        entry = self._entries.get(prompt_id)
        return {prompt_id: entry.as_json()} if entry else {}

    def all(self, max_items: int | None = None) -> dict[str, Any]:
        items = list(self._entries.items())
        if max_items is not None:
            items = items[-max_items:] if max_items > 0 else []
        return {k: v.as_json() for k, v in items}
