"""Stand-in for ``comfy.model_management``: which patchers are on the GPU."""

from __future__ import annotations

import threading
from typing import Any

gate: threading.Semaphore | None = None
"""When set, each load_models_gpu call that moves something waits for one release (bounded)."""
moved: list[Any] = []
"""Every patcher moved onto the GPU, in order: one already loaded is not moved again."""


class LoadedModel:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.currently_used = True


current_loaded_models: list[LoadedModel] = []


def load_models_gpu(
    models: list[Any],
    memory_required: int = 0,
    force_patch_weights: bool = False,
    minimum_memory_required: int | None = None,
    force_full_load: bool = False,
) -> None:
    loaded = [m.model for m in current_loaded_models]
    to_load = [m for m in models if not any(m is x for x in loaded)]
    if not to_load:
        return
    if gate is not None and not gate.acquire(timeout=10):
        raise TimeoutError("stand-in: the test never released this load")
    for model in to_load:
        if str(model.model).startswith("unet of") and "oom" in str(model.model):
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")
        moved.append(model)
        current_loaded_models.insert(0, LoadedModel(model))


def load_model_gpu(model: Any) -> None:
    return load_models_gpu([model])


def loaded_models(only_currently_used: bool = False) -> list[Any]:
    return [m.model for m in current_loaded_models if m.currently_used or not only_currently_used]


def unload_all_models() -> None:
    current_loaded_models.clear()
