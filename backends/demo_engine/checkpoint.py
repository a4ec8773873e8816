"""The synthetic checkpoint: created once on disk, then loaded and kept resident.

Creation writes deterministic pseudo-random bytes in chunks (atomically, via a temporary file),
so every engine on a machine shares one file and a second start skips the write. Loading reads
the whole file in chunks on a worker thread and keeps it in a bytearray, or streams it into a
uint8 tensor on the GPU. Both are cancellable between chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import random
import threading
import time
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """The checkpoint could not be created or loaded."""


class LoadState(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


class Model(Protocol):
    """What the server and executor need from a checkpoint; tests substitute a fake."""

    @property
    def state(self) -> LoadState: ...

    @property
    def error(self) -> str | None: ...

    def start(self) -> None: ...

    async def ensure_loaded(self) -> None: ...

    def sample(self, offset: int, length: int) -> bytes: ...

    async def aclose(self) -> None: ...


class _Cancelled(Exception):
    """Raised on the worker thread when the owner asked the load to stop."""


def _check(cancel: threading.Event) -> None:
    if cancel.is_set():
        raise _Cancelled


def create_file(path: Path, size: int, chunk_size: int, cancel: threading.Event) -> bool:
    """Make sure `path` holds `size` deterministic bytes; return True if it was (re)written."""
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size == size:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"warmgate-demo-checkpoint:{size}")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as out:
            written = 0
            while written < size:
                _check(cancel)
                n = min(chunk_size, size - written)
                out.write(rng.randbytes(n))
                written += n
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return True


def read_to_host(path: Path, size: int, chunk_size: int, cancel: threading.Event) -> bytearray:
    """Read the whole file into one bytearray, chunk by chunk."""
    data = bytearray(size)
    view = memoryview(data)
    with path.open("rb", buffering=0) as src:
        offset = 0
        while offset < size:
            _check(cancel)
            n = src.readinto(view[offset : offset + chunk_size])
            if not n:
                raise CheckpointError(f"{path}: file ended at byte {offset} of {size}")
            offset += n
    view.release()
    return data


def read_to_cuda(
    path: Path, size: int, chunk_size: int, cancel: threading.Event, torch: Any
) -> Any:
    """Stream the file into a uint8 CUDA tensor through one reused host buffer."""
    gpu = torch.empty(size, dtype=torch.uint8, device="cuda")
    buf = bytearray(chunk_size)
    host = torch.frombuffer(buf, dtype=torch.uint8)
    with path.open("rb", buffering=0) as src:
        offset = 0
        while offset < size:
            _check(cancel)
            n = src.readinto(buf)
            if not n:
                raise CheckpointError(f"{path}: file ended at byte {offset} of {size}")
            gpu[offset : offset + n].copy_(host[:n])
            offset += n
    torch.cuda.synchronize()
    return gpu


class Checkpoint:
    """One model's weights: loaded at most once, shared by every render."""

    def __init__(self, path: Path, size: int, *, chunk_size: int, torch: Any | None = None):
        self.path = path
        self.size = size
        self._chunk_size = chunk_size
        self._torch = torch
        self._cancel = threading.Event()
        """Set to stop the worker thread of the current load between two chunks."""
        self._task: asyncio.Task[None] | None = None
        self._state = LoadState.UNLOADED
        self._host: bytearray | None = None
        self._gpu: Any = None
        self.error: str | None = None
        self.load_seconds: float | None = None

    @property
    def state(self) -> LoadState:
        return self._state

    def start(self) -> None:
        """Begin loading in the background if nothing has started it yet."""
        if self._task is None or self._state is LoadState.FAILED:
            self._state = LoadState.LOADING
            self._cancel = threading.Event()
            self.error = None
            self._task = asyncio.get_running_loop().create_task(
                self._load(), name=f"checkpoint-load:{self.path.name}"
            )

    async def ensure_loaded(self) -> None:
        """Start the load if needed and wait for it; raises CheckpointError if it failed."""
        self.start()
        assert self._task is not None
        await asyncio.shield(self._task)

    async def _load(self) -> None:
        started = time.perf_counter()
        log.info("loading checkpoint %s (%d bytes)", self.path, self.size)
        cancel = self._cancel
        try:
            host, gpu = await asyncio.to_thread(self._load_blocking, cancel)
        except asyncio.CancelledError:
            cancel.set()
            self._state = LoadState.UNLOADED
            raise
        except _Cancelled:
            self._state = LoadState.UNLOADED
            return
        except (OSError, CheckpointError, RuntimeError) as exc:
            self._state = LoadState.FAILED
            self.error = str(exc)
            log.error("checkpoint load failed: %s", exc)
            raise CheckpointError(f"loading {self.path} failed: {exc}") from exc
        self._host, self._gpu = host, gpu
        self.load_seconds = time.perf_counter() - started
        self._state = LoadState.LOADED
        log.info("checkpoint loaded in %.2fs", self.load_seconds)

    def _load_blocking(self, cancel: threading.Event) -> tuple[bytearray | None, Any]:
        """Runs on a worker thread: create the file if needed, then read it all in."""
        if create_file(self.path, self.size, self._chunk_size, cancel):
            log.info("created checkpoint file %s", self.path)
        if self._torch is None:
            return read_to_host(self.path, self.size, self._chunk_size, cancel), None
        gpu = read_to_cuda(self.path, self.size, self._chunk_size, cancel, self._torch)
        return None, gpu

    def sample(self, offset: int, length: int) -> bytes:
        """`length` bytes of the resident weights starting at `offset` (wrapping around)."""
        if self._state is not LoadState.LOADED:
            raise CheckpointError("checkpoint is not loaded")
        start = offset % max(1, self.size - length) if self.size > length else 0
        end = min(self.size, start + length)
        if self._gpu is not None:
            return bytes(self._gpu[start:end].cpu().tolist())
        assert self._host is not None
        return bytes(self._host[start:end])

    async def aclose(self) -> None:
        """Stop a load in progress and release the weights."""
        self._cancel.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved, so asyncio does not log it as unhandled
        self._host = None
        self._gpu = None
        self._state = LoadState.UNLOADED
