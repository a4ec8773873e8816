"""ComfyUI's own web page (``comfyui-frontend-package``, the frontend ComfyUI 0.3.64 pins) on
the demo engine behind warmgate, driven in Chromium: what it takes to see it load, run the
default graph and follow the socket frames the tab receives."""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, demo_engine

needs_frontend = pytest.mark.skipif(
    importlib.util.find_spec("comfyui_frontend_package") is None,
    reason="comfyui-frontend-package is not installed (the dev extras bring it)",
)

GRAPH_LOADED = "() => window.app?.graph?.nodes?.length >= 7"
"""ComfyUI's default graph is on the canvas: the page built it from /object_info."""

SHOWN = """() => Object.values(window.app?.nodeOutputs ?? {})
  .some(o => (o.images ?? []).some(i => i.filename.startsWith('ComfyUI_')))"""
"""The page holds a rendered image as a node's output: it took an ``executed`` frame."""


def comfy(tmp: Path, **scaling: Any) -> dict[str, Any]:
    """The demo engine serving ComfyUI's page, as one target at ``/``."""
    command = demo_engine(
        "--steps", "3", "--frontend", "comfyui", render_seconds=0.5,
        checkpoint=tmp / "checkpoint.bin",
    )  # fmt: skip
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {
            "comfy": {
                "engine": "comfyui",
                "routes": [{"path_prefix": "/"}],
                "backend": {"kind": "process", "command": command, "cwd": str(ROOT)},
                "readiness": {"path": "/readyz", "interval": "100ms"},
                "scaling": {"busy_poll": "200ms", "cold_start_timeout": "120s", **scaling},
            }
        },
    }


@dataclass
class Tab:
    """What one page saw: its websockets and the frames each received, its requests."""

    page: Any
    sockets: list[Any] = field(default_factory=list)
    frames: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    """(which socket, the JSON message) for every text frame received."""
    documents: list[tuple[float, str, int | None]] = field(default_factory=list)
    """(monotonic time, url, status or None for the request) of every page load."""
    requests: list[str] = field(default_factory=list)

    def watch(self) -> Tab:
        def opened(ws: Any) -> None:
            index = len(self.sockets)
            self.sockets.append(ws)

            def frame(payload: Any) -> None:
                if isinstance(payload, str):
                    self.frames.append((index, json.loads(payload)))

            ws.on("framereceived", frame)

        def request(r: Any) -> None:
            self.requests.append(r.method + " " + r.url)
            if r.is_navigation_request():
                self.documents.append((time.monotonic(), r.url, None))

        def response(r: Any) -> None:
            if r.request.is_navigation_request():
                self.documents.append((time.monotonic(), r.url, r.status))

        self.page.on("websocket", opened)
        self.page.on("request", request)
        self.page.on("response", response)
        return self

    def seen(self, kind: str, prompt_id: str | None = None) -> list[tuple[int, dict[str, Any]]]:
        return [
            (i, m)
            for i, m in self.frames
            if m.get("type") == kind
            and (prompt_id is None or m.get("data", {}).get("prompt_id") == prompt_id)
        ]

    async def run(self) -> str:
        """Click Run, as a person does; the prompt id the page queued (from its POST)."""
        async with self.page.expect_response(
            lambda r: r.request.method == "POST" and r.url.endswith("/api/prompt"),
            timeout=120_000,
        ) as answer:
            await self.page.get_by_role("button", name="Run", exact=True).first.click()
        reply = await answer.value
        assert reply.status == 200, await reply.text()
        return str((await reply.json())["prompt_id"])

    async def executed(self, prompt_id: str) -> dict[str, Any]:
        """Wait until the page took the ``executed`` frame of ``prompt_id`` (its image is the
        output of a node on its canvas); the frame's data."""
        await self.page.wait_for_function(SHOWN, timeout=120_000)
        found = self.seen("executed", prompt_id)
        assert found, f"the tab received no executed frame for {prompt_id}"
        return found[-1][1]["data"]  # type: ignore[no-any-return]
