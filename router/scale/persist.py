"""State that survives a restart of warmgate: small JSON documents in a
:class:`backends.base.StateStore`, written through as they change.

On one machine the store is :class:`FileStore`, a directory of files (``state_dir``); in a
cluster a backend offers its own (the Kubernetes backend keeps a target's figures on its
Deployment, the replicas keep the day's spend in a ConfigMap). Whoever learns something keeps
a :class:`Writer` for its key: ``put`` never blocks and never raises; the latest document is
written in the background, one write at a time, and ``close`` waits for the last one. What
cannot be read back is ignored with a warning: a lost document costs a relearn, never a start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from backends.base import BackendError, StateStore

log = logging.getLogger("warmgate.state")

KEY = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
"""What a key may be: it names a file, an annotation and a ConfigMap key alike."""

CLOSE_TIMEOUT = 5.0
"""Seconds ``Writer.close`` waits for the last write (a store away must not hold a shutdown)."""


def check_key(key: str) -> str:
    if not KEY.match(key):
        raise ValueError(f"state key {key!r}: expected lowercase letters, digits, '.', '_', '-'")
    return key


def decode(raw: str | bytes, where: str) -> dict[str, Any] | None:
    """A stored document, or ``None`` (with a warning) when it is not a JSON object."""
    try:
        document = json.loads(raw)
    except ValueError as exc:
        log.warning("ignoring unreadable state %s: %s", where, exc)
        return None
    if not isinstance(document, dict):
        log.warning("ignoring state %s: expected a JSON object", where)
        return None
    return document


def encode(document: Mapping[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


class FileStore:
    """Documents as files ``<directory>/<prefix><key>.json``. The directory is created on the
    first write; a write goes to a temporary file that is renamed over the old one, so a crash
    mid-write leaves the previous document whole."""

    def __init__(self, directory: str | Path, prefix: str = "") -> None:
        self.directory = Path(directory)
        self.prefix = prefix

    @property
    def where(self) -> str:
        return str(self.directory)

    def path(self, key: str) -> Path:
        return self.directory / f"{self.prefix}{check_key(key)}.json"

    async def load(self, key: str) -> dict[str, Any] | None:
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("ignoring state %s: %s", path, exc.strerror or exc)
            return None
        return decode(raw, str(path))

    async def load_all(self, prefix: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        with contextlib.suppress(OSError):
            for path in sorted(self.directory.glob(f"{self.prefix}{prefix}*.json")):
                key = path.name[len(self.prefix) : -len(".json")]
                if KEY.match(key) and (document := await self.load(key)) is not None:
                    found[key] = document
        return found

    async def save(self, key: str, document: Mapping[str, Any]) -> None:
        path = self.path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(encode(document), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise BackendError(f"cannot write {path}: {exc.strerror or exc}") from exc


class Writer:
    """Writes one key's latest document through to a store, in the background."""

    def __init__(self, store: StateStore, key: str) -> None:
        self.store = store
        self.key = check_key(key)
        self._latest: dict[str, Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing: str | None = None
        self.writes = 0
        """Documents written so far."""

    def put(self, document: Mapping[str, Any]) -> None:
        """Write ``document`` soon; a newer one put meanwhile replaces it unwritten."""
        self._latest = dict(document)
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name=f"state:{self.key}")

    async def _run(self) -> None:
        while self._latest is not None:
            document, self._latest = self._latest, None
            try:
                await self.store.save(self.key, document)
            except Exception as exc:  # never fatal: the next change tries again
                problem = str(exc)
                if problem != self._failing:
                    log.warning("cannot keep %s in %s: %s", self.key, self.store.where, problem)
                self._failing = problem
                continue
            self.writes += 1
            if self._failing is not None:
                log.info("%s kept in %s again", self.key, self.store.where)
                self._failing = None

    async def flush(self) -> None:
        """Wait until what was put is written (or failed)."""
        task = self._task
        if task is not None:
            await asyncio.shield(task)

    async def close(self) -> None:
        """The last document is written (within :data:`CLOSE_TIMEOUT`), nothing after."""
        task = self._task
        if task is None:
            return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await asyncio.shield(task)
        except TimeoutError:
            log.warning("%s: the last write to %s did not finish", self.key, self.store.where)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
