"""The FIFO prompt queue: one worker task runs prompts in order and records their history.

The queue knows nothing about rendering or websockets. It calls an `Executor` to run a prompt,
records the resulting history entry, then lets the executor announce completion, so a client
that reacts to `execution_success` by fetching /history always finds the entry.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .graph import ParsedPrompt
from .history import History, HistoryEntry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QueuedPrompt:
    """One accepted prompt."""

    number: int
    prompt_id: str
    parsed: ParsedPrompt
    client_id: str | None

    def row(self) -> list[Any]:
        """ComfyUI's queue row: [number, prompt_id, graph, extra_data, outputs_to_execute]."""
        extra = {"client_id": self.client_id} if self.client_id else {}
        return [self.number, self.prompt_id, self.parsed.graph, extra, [self.parsed.output_node]]


class Executor(Protocol):
    async def execute(self, item: QueuedPrompt) -> HistoryEntry:
        """Run the prompt; failures come back as an entry with success=False."""
        ...

    async def announce_done(self, item: QueuedPrompt, entry: HistoryEntry) -> None:
        """Tell clients the prompt finished; called after its history is recorded."""
        ...


StatusListener = Callable[[int], Awaitable[None]]
"""Called with queue_remaining whenever the queue changes."""


class PromptQueue:
    def __init__(self, executor: Executor, on_change: StatusListener, history: History):
        self._executor = executor
        self._on_change = on_change
        self.history = history
        self._pending: collections.deque[QueuedPrompt] = collections.deque()
        self._running: QueuedPrompt | None = None
        self._wakeup = asyncio.Event()
        self._counter = 0

    @property
    def remaining(self) -> int:
        """Queued plus running, as ComfyUI counts `queue_remaining`."""
        return len(self._pending) + (self._running is not None)

    def snapshot(self) -> dict[str, list[list[Any]]]:
        """The body of GET /queue."""
        running = [self._running.row()] if self._running else []
        return {"queue_running": running, "queue_pending": [p.row() for p in self._pending]}

    async def put(self, parsed: ParsedPrompt, client_id: str | None) -> QueuedPrompt:
        item = QueuedPrompt(self._counter, str(uuid.uuid4()), parsed, client_id)
        self._counter += 1
        self._pending.append(item)
        self._wakeup.set()
        try:
            await self._on_change(self.remaining)
        except Exception:
            log.exception("status broadcast failed")
        return item

    async def run(self) -> None:
        """The worker: forever take the oldest prompt and run it."""
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            item = self._running = self._pending.popleft()
            try:
                entry = await self._executor.execute(item)
            except Exception:
                log.exception("prompt %s crashed", item.prompt_id)
                entry = HistoryEntry(row=item.row(), success=False)
            finally:
                self._running = None
            self.history.add(item.prompt_id, entry)
            try:
                await self._executor.announce_done(item, entry)
                await self._on_change(self.remaining)
            except Exception:  # a notification failing must not stop the worker
                log.exception("announcing prompt %s failed", item.prompt_id)
