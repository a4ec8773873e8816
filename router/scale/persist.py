"""State that survives a restart of warmgate: small JSON documents in a
:class:`backends.documents.StateStore`, written through as they change.

On one machine the store is :class:`FileStore`, a directory of files (``state_dir``); in a
cluster a backend offers its own (the Kubernetes backend keeps a target's figures on its
Deployment, the replicas keep the day's spend in a ConfigMap). Whoever learns something keeps
a :class:`Writer` for its key: ``put`` never blocks and never raises; the latest document is
written in the background, one write at a time, and ``close`` waits for the last one. What
cannot be read back (:mod:`backends.documents`) or is not one a reader takes
(:func:`read_back`) is ignored with one warning: a lost document costs a relearn, never a start.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import secrets
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from backends.base import BackendError
from backends.documents import MAX_DOCUMENT, StateStore, decode, encode, refused
from backends.outside import one_line

log = logging.getLogger("warmgate.state")

KEY = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
"""What a key may be: it names a file, an annotation and a ConfigMap key alike."""

CLOSE_TIMEOUT = 5.0
"""Seconds ``Writer.close`` waits for the last write (a store away must not hold a shutdown)."""


def check_key(key: str) -> str:
    if not KEY.match(key):
        raise ValueError(f"state key {key!r}: expected lowercase letters, digits, '.', '_', '-'")
    return key


def read_document(path: Path) -> dict[str, Any] | None:
    """The document in ``path``, or ``None``: missing, or refused with one warning (not a
    regular file, a link, larger than :data:`MAX_DOCUMENT`, unreadable). Blocking: call it off
    the event loop. Opened without following a link and without waiting for a writer (a FIFO
    is refused, not waited on), then checked on the open file, so nothing swaps it between."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        refused(str(path), why)
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            refused(str(path), "not a regular file")
            return None
        if info.st_size > MAX_DOCUMENT:
            refused(str(path), f"larger than {MAX_DOCUMENT} bytes ({info.st_size})")
            return None
        raw = _read_at_most(fd, MAX_DOCUMENT + 1)  # it may have grown since fstat
    except OSError as exc:
        refused(str(path), exc.strerror or str(exc))
        return None
    finally:
        os.close(fd)
    return decode(raw, str(path))


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_document(path: Path, document: Mapping[str, Any]) -> None:
    """``document`` into ``path``, whole or not at all. Blocking: call it off the event loop.
    Through a temporary file of a random name beside it, created (never opened: ``O_EXCL``,
    no link followed) with mode 0600, fsync'd, then renamed over ``path`` (a link there is
    replaced, not followed) and the directory fsync'd so that the rename outlives a crash."""
    data = encode(document).encode()
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{path.name}.{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # not every file system lets a directory be opened
        dirfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)


class FileStore:
    """Documents as files ``<directory>/<prefix><key>.json``: read and written in a thread
    (:func:`read_document`, :func:`write_document`), never on the event loop. The directory
    is created on the first write; a crash mid-write leaves the previous document whole."""

    def __init__(self, directory: str | Path, prefix: str = "") -> None:
        self.directory = Path(directory)
        self.prefix = prefix

    @property
    def where(self) -> str:
        return str(self.directory)

    def name_of(self, key: str) -> str:
        return str(self.path(key))

    def path(self, key: str) -> Path:
        return self.directory / f"{self.prefix}{check_key(key)}.json"

    async def load(self, key: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(read_document, self.path(key))

    async def load_all(self, prefix: str) -> dict[str, dict[str, Any]]:
        return await asyncio.to_thread(self._load_all, prefix)

    def _load_all(self, prefix: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        with contextlib.suppress(OSError):
            for path in sorted(self.directory.glob(f"{self.prefix}{prefix}*.json")):
                key = path.name[len(self.prefix) : -len(".json")]
                if KEY.match(key) and (document := read_document(path)) is not None:
                    found[key] = document
        return found

    async def save(self, key: str, document: Mapping[str, Any]) -> None:
        path = self.path(key)
        try:
            await asyncio.to_thread(write_document, path, document)
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise BackendError(f"cannot write {path}: {why}") from exc


class Readable(Protocol):
    """What :func:`read_back` needs of a store (:class:`backends.documents.StateStore` is one)."""

    async def load(self, key: str) -> dict[str, Any] | None: ...

    def name_of(self, key: str) -> str: ...


async def read_back(
    store: Readable, key: str, take: Callable[[dict[str, Any]], bool], what: str, owner: str = ""
) -> bool:
    """Give ``take`` the document ``key`` a previous run kept in ``store``; whether it took it.
    One it refuses (another form, a value of the wrong type or out of range), or that breaks it,
    is ignored with one warning naming it (``owner``: the target, for the message): relearned,
    never a failed start. One the store could not read was warned of there."""
    document = await store.load(key)
    if document is None:
        return False
    try:
        if take(document):
            return True
        why = "not one this version reads (a field missing, of the wrong type or out of range)"
    except Exception as exc:  # a reader's slip must not stop a start either
        why = f"{type(exc).__name__}: {exc}"
    lead = f"{owner}: " if owner else ""
    log.warning("%signoring %s in %s: %s", lead, what, one_line(store.name_of(key)), one_line(why))
    return False


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
