"""The synthetic checkpoint: created once on disk, then loaded and kept resident.

Creation writes deterministic pseudo-random bytes in chunks (atomically, via a temporary file),
so every engine on a machine shares one file and a second start skips the write. Loading reads
the whole file in chunks on a worker thread and keeps it in a bytearray, or streams it into a
uint8 tensor on the GPU. Both are cancellable between chunks.

Parking (ComfyUI's ``POST /free``) takes the weights off the device into host memory, as
ComfyUI offloads its models: on CUDA they are copied to pinned host memory and the GPU memory is
given back to the driver, so the reload on the next render is one host-to-device copy; on the
CPU (which has no device memory of its own to free) the resident copy is dropped and the reload
copies the host copy back.
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
from collections.abc import Callable
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
    PARKED = "parked"
    """Freed by ``POST /free``: loaded again by the next render (the engine stays ready)."""
    RELOADING = "reloading"
    """Parked, and the checkpoint on its way back for a render (the engine stays ready)."""


class Model(Protocol):
    """What the server and executor need from a checkpoint; tests substitute a fake."""

    @property
    def state(self) -> LoadState: ...

    @property
    def error(self) -> str | None: ...

    @property
    def progress(self) -> float | None:
        """How far a load in progress is (0..1); ``None`` when none is."""
        ...

    def start(self) -> None: ...

    async def ensure_loaded(self) -> None: ...

    def sample(self, offset: int, length: int) -> bytes: ...

    async def park(self) -> None:
        """Drop the weights from the device; the next ``ensure_loaded`` loads them again."""
        ...

    @property
    def resident_bytes(self) -> int:
        """Bytes of weights on the device now."""
        ...

    async def aclose(self) -> None: ...


class _Cancelled(Exception):
    """Raised on the worker thread when the owner asked the load to stop."""


def _check(cancel: threading.Event) -> None:
    if cancel.is_set():
        raise _Cancelled


def create_file(
    path: Path,
    size: int,
    chunk_size: int,
    cancel: threading.Event,
    done: Callable[[int], None] | None = None,
) -> bool:
    """Make sure `path` holds `size` deterministic bytes; return True if it was (re)written.
    ``done`` is told the bytes of each chunk written."""
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
                if done is not None:
                    done(n)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return True


def read_to_host(
    path: Path,
    size: int,
    chunk_size: int,
    cancel: threading.Event,
    done: Callable[[int], None] | None = None,
) -> bytearray:
    """Read the whole file into one bytearray, chunk by chunk (``done``: told each chunk)."""
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
            if done is not None:
                done(n)
    view.release()
    return data


def offload_to_host(gpu: Any, torch: Any) -> Any:
    """A pinned host copy of a CUDA tensor (pinned: the copy back runs at full PCIe speed)."""
    host = torch.empty(gpu.numel(), dtype=torch.uint8, pin_memory=True)
    host.copy_(gpu)
    return host


def copy_in_chunks(source: bytearray, chunk_size: int, cancel: threading.Event) -> bytearray:
    """A copy of ``source``, a chunk at a time (the engine's loop runs between chunks)."""
    data = bytearray(len(source))
    view, src = memoryview(data), memoryview(source)
    for offset in range(0, len(source), chunk_size):
        _check(cancel)
        view[offset : offset + chunk_size] = src[offset : offset + chunk_size]
    view.release()
    src.release()
    return data


def reload_to_cuda(host: Any, torch: Any) -> Any:
    """The pinned host copy back on the GPU, in one copy."""
    gpu = torch.empty(host.numel(), dtype=torch.uint8, device="cuda")
    gpu.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return gpu


def read_to_cuda(
    path: Path,
    size: int,
    chunk_size: int,
    cancel: threading.Event,
    torch: Any,
    done: Callable[[int], None] | None = None,
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
            if done is not None:
                done(n)
    torch.cuda.synchronize()
    return gpu


class Checkpoint:
    """One model's weights: loaded at most once, shared by every render."""

    def __init__(
        self,
        path: Path,
        size: int,
        *,
        chunk_size: int,
        torch: Any | None = None,
        load_seconds: float = 0.0,
    ):
        self.path = path
        self.size = size
        self._chunk_size = chunk_size
        self._torch = torch
        self._pace = load_seconds
        """A load is paced to take at least this long (a demo of a slow disk or a big model)."""
        self._loaded = 0
        self._to_load = size
        self._load_began = 0.0
        self._cancel = threading.Event()
        """Set to stop the worker thread of the current load between two chunks."""
        self._task: asyncio.Task[None] | None = None
        self._state = LoadState.UNLOADED
        self._host: bytearray | None = None
        self._gpu: Any = None
        self._offloaded: Any = None
        """While parked: the weights in host memory (pinned, on CUDA)."""
        self.error: str | None = None
        self.load_seconds: float | None = None

    @property
    def state(self) -> LoadState:
        return self._state

    @property
    def progress(self) -> float | None:
        """How far the load in progress is (0..1); ``None`` when none is."""
        if self._state is not LoadState.LOADING:
            return None
        return min(1.0, self._loaded / max(1, self._to_load))

    def _done(self, n: int) -> None:
        """On the worker thread, after each chunk: count it; slow down to the pace."""
        self._loaded += n
        if self._pace > 0:
            due = self._load_began + self._pace * self._loaded / max(1, self._to_load)
            ahead = due - time.monotonic()
            if ahead > 0:
                self._cancel.wait(ahead)

    def start(self) -> None:
        """Begin loading in the background if nothing has started it yet (or it was parked)."""
        if self._task is None or self._state in (LoadState.FAILED, LoadState.PARKED):
            parked = self._state is LoadState.PARKED
            self._state = LoadState.RELOADING if parked else LoadState.LOADING
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
        """Runs on a worker thread: create the file if needed, then read it all in (after a
        park on CUDA: copy the pinned host copy back)."""
        offloaded, self._offloaded = self._offloaded, None
        if offloaded is not None and self._torch is None:
            return copy_in_chunks(offloaded, self._chunk_size, cancel), None
        if offloaded is not None:
            return None, reload_to_cuda(offloaded, self._torch)
        exists = self.path.is_file() and self.path.stat().st_size == self.size
        self._loaded, self._to_load = 0, self.size if exists else 2 * self.size
        self._load_began = time.monotonic()
        if create_file(self.path, self.size, self._chunk_size, cancel, self._done):
            log.info("created checkpoint file %s", self.path)
        if self._torch is None:
            return read_to_host(self.path, self.size, self._chunk_size, cancel, self._done), None
        gpu = read_to_cuda(self.path, self.size, self._chunk_size, cancel, self._torch, self._done)
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

    @property
    def resident_bytes(self) -> int:
        return self.size if self._state is LoadState.LOADED else 0

    async def park(self) -> None:
        """Drop the weights from the device; the next render loads them again. A load in
        progress ends first (a render may be waiting for it). On CUDA the weights are kept in
        pinned host memory and the GPU memory goes back to the driver."""
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        self._task = None
        gpu, self._gpu, self._host, host = self._gpu, None, None, self._host
        if gpu is not None and self._torch is not None:
            self._offloaded = await asyncio.to_thread(self._offload, gpu)
            del gpu
            self._torch.cuda.empty_cache()
        elif host is not None:
            self._offloaded = host
        self._state = LoadState.PARKED
        kept = "kept in host memory" if self._offloaded is not None else "dropped"
        log.info("checkpoint parked (%s); the next render loads it again", kept)

    def _offload(self, gpu: Any) -> Any:
        try:
            return offload_to_host(gpu, self._torch)
        except RuntimeError as exc:  # no pinned memory to spare: read the file again instead
            log.warning("keeping the checkpoint in host memory failed (%s)", exc)
            return None

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
