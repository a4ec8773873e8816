"""The eager load, through ComfyUI's own loader and model management, and its hand-over to renders.

At start a thread loads each checkpoint named in ``EAGER_CHECKPOINTS`` exactly as a workflow's
``CheckpointLoaderSimple`` node would (``folder_paths.get_full_path_or_raise`` then
``comfy.sd.load_checkpoint_guess_config``), then moves the model, CLIP and VAE into VRAM with
``comfy.model_management.load_models_gpu``. The outputs are kept here, which also keeps ComfyUI's
model management from dropping them as unreferenced between prompts.

Hand-over: ``CheckpointLoaderSimple.load_checkpoint`` is wrapped so that a render asking for an
eagerly loaded checkpoint gets these very objects (the executor caches them as that node's
outputs from then on). Its sampler, text encoder and VAE then call ``load_models_gpu`` with
patchers that are already loaded, which moves nothing. A render that arrives while the eager load
is still running waits for it instead of loading a second copy next to it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from . import readiness
from .readiness import Readiness

log = logging.getLogger("warmgate.readyz")

Outputs = tuple[Any, Any, Any]
"""(MODEL, CLIP, VAE) as ``CheckpointLoaderSimple`` returns them."""


class EagerLoad:
    """Owns the readiness snapshot and the resident outputs."""

    def __init__(self, settings: readiness.Settings, load: Callable[[str], Outputs]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._state = readiness.initial(settings)
        self._resident: dict[str, Outputs] = {}
        self._finished = threading.Event()
        if not settings.eager or settings.error is not None:
            self._finished.set()
        if settings.error is not None:
            log.error("warmgate: /readyz stays 503: %s", settings.error)

    @property
    def state(self) -> Readiness:
        return self._state

    def _advance(self, change: Callable[[Readiness], Readiness]) -> None:
        with self._lock:
            self._state = change(self._state)

    def start(self) -> threading.Thread | None:
        if self._finished.is_set():
            return None
        thread = threading.Thread(target=self.run, name="warmgate-eager-load", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        names = self._state.checkpoints
        log.info("warmgate: loading %d checkpoint(s) at start: %s", len(names), ", ".join(names))
        try:
            if all(self._load_one(name) for name in names):
                log.info("warmgate: resident, /readyz answers 200: %s", ", ".join(names))
        finally:
            self._finished.set()

    def _load_one(self, name: str) -> bool:
        """Read ``name`` and move it into VRAM; False (logged, and in the snapshot) if it failed:
        the checkpoints after it are not loaded."""
        import comfy.model_management as model_management

        started = time.monotonic()
        self._advance(lambda s: readiness.begin(s, name))
        try:
            outputs = self._load(name)
            self._advance(readiness.step_done)
            model_management.load_models_gpu(patchers(outputs))
        except Exception as exc:
            error = f"{name}: {type(exc).__name__}: {exc}"
            log.exception("warmgate: eager load failed, /readyz stays 503: %s", error)
            self._advance(lambda s: readiness.failed(s, error))
            return False
        with self._lock:
            self._resident[name] = outputs
            self._state = readiness.resident(readiness.step_done(self._state), name)
        log.info("warmgate: %s in VRAM after %.1f s", name, time.monotonic() - started)
        return True

    def outputs_for(self, name: str) -> Outputs | None:
        """The resident outputs for ``name`` (after waiting for a running eager load), or None:
        the caller loads it the ordinary way."""
        self._finished.wait()
        return self._resident.get(name)

    def in_vram(self) -> frozenset[str]:
        """Loaded checkpoints whose model ComfyUI's model management holds on the GPU now."""
        import comfy.model_management as model_management

        on_gpu = model_management.loaded_models()
        with self._lock:
            resident = list(self._resident.items())
        return frozenset(name for name, out in resident if any(m is out[0] for m in on_gpu))


def patchers(outputs: Outputs) -> list[Any]:
    """The ModelPatchers behind a checkpoint's outputs: the model itself, the text encoder's
    and the VAE's (a checkpoint without CLIP or VAE gives None for them)."""
    model, clip, vae = outputs
    found = [model, getattr(clip, "patcher", None), getattr(vae, "patcher", None)]
    return [p for p in found if p is not None]


def hand_over(loader_class: Any, eager: EagerLoad) -> None:
    """Wrap ``loader_class.load_checkpoint`` so that eagerly loaded checkpoints come from
    ``eager`` (the eager load itself calls the original method)."""
    original: Callable[..., Outputs] = loader_class.load_checkpoint

    def load_checkpoint(self: Any, ckpt_name: str, *args: Any, **kwargs: Any) -> Outputs:
        outputs = eager.outputs_for(ckpt_name)
        if outputs is not None:
            return outputs
        return original(self, ckpt_name, *args, **kwargs)

    load_checkpoint.__wrapped__ = original  # type: ignore[attr-defined]
    loader_class.load_checkpoint = load_checkpoint
