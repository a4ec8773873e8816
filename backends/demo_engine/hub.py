"""The websocket hub: who is connected, and fanning messages out to them.

Like ComfyUI, a message addressed to a client id goes only to sockets that connected with that
`clientId`; a message without one (status, or a prompt submitted without client_id) goes to all.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

from aiohttp import WSCloseCode, web

PREVIEW_IMAGE = 1
"""ComfyUI's BinaryEventTypes.PREVIEW_IMAGE."""
PNG_FORMAT = 2
"""Image format code for PNG in a preview frame (1 is JPEG)."""


def preview_frame(png: bytes) -> bytes:
    """A binary preview message: event type and image format as big-endian u32, then the PNG."""
    return struct.pack(">II", PREVIEW_IMAGE, PNG_FORMAT) + png


def status_message(queue_remaining: int, sid: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"status": {"exec_info": {"queue_remaining": queue_remaining}}}
    if sid is not None:
        data["sid"] = sid
    return {"type": "status", "data": data}


class Hub:
    def __init__(self) -> None:
        self._sockets: dict[web.WebSocketResponse, str] = {}

    def __len__(self) -> int:
        return len(self._sockets)

    def add(self, ws: web.WebSocketResponse, sid: str) -> None:
        self._sockets[ws] = sid

    def remove(self, ws: web.WebSocketResponse) -> None:
        self._sockets.pop(ws, None)

    def _targets(self, client_id: str | None) -> list[web.WebSocketResponse]:
        return [
            ws
            for ws, sid in self._sockets.items()
            if not ws.closed and (client_id is None or sid == client_id)
        ]

    async def _send(self, targets: list[web.WebSocketResponse], payload: str | bytes) -> None:
        async def one(ws: web.WebSocketResponse) -> None:
            try:
                if isinstance(payload, bytes):
                    await ws.send_bytes(payload)
                else:
                    await ws.send_str(payload)
            except (ConnectionError, RuntimeError):
                self.remove(ws)

        await asyncio.gather(*(one(ws) for ws in targets))

    async def send_json(self, kind: str, data: dict[str, Any], client_id: str | None) -> None:
        payload = json.dumps({"type": kind, "data": data})
        await self._send(self._targets(client_id), payload)

    async def send_preview(self, png: bytes, client_id: str | None) -> None:
        await self._send(self._targets(client_id), preview_frame(png))

    async def broadcast_status(self, queue_remaining: int) -> None:
        await self._send(self._targets(None), json.dumps(status_message(queue_remaining)))

    async def close_all(self) -> None:
        sockets = list(self._sockets)
        self._sockets.clear()
        await asyncio.gather(
            *(ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown") for ws in sockets),
            return_exceptions=True,
        )
