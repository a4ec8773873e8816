"""Stand-in for ``comfy.sd``: a checkpoint file becomes (MODEL, CLIP, VAE, CLIP_VISION)."""

from __future__ import annotations

import threading
from typing import Any

from comfy.model_patcher import ModelPatcher

calls: list[str] = []
"""Every checkpoint path read, in order: a render that loads nothing leaves it unchanged."""
gate: threading.Semaphore | None = None
"""When set, each read waits for one release (bounded), so a test can watch the progress."""


class CLIP:
    def __init__(self, name: str) -> None:
        self.patcher = ModelPatcher(f"clip of {name}")


class VAE:
    def __init__(self, name: str) -> None:
        self.patcher = ModelPatcher(f"vae of {name}")


def load_checkpoint_guess_config(
    ckpt_path: str,
    output_vae: bool = True,
    output_clip: bool = True,
    output_clipvision: bool = False,
    embedding_directory: Any = None,
    output_model: bool = True,
    model_options: Any = None,
    te_model_options: Any = None,
) -> tuple[Any, Any, Any, Any]:
    if gate is not None and not gate.acquire(timeout=10):
        raise TimeoutError("stand-in: the test never released this read")
    with open(ckpt_path, "rb") as checkpoint:
        header = checkpoint.read(64)
    calls.append(ckpt_path)
    if not header.startswith(b"stand-in checkpoint"):
        raise RuntimeError(f"ERROR: Could not detect model type of: {ckpt_path}")
    model = ModelPatcher(f"unet of {ckpt_path}")
    clip = CLIP(ckpt_path) if output_clip else None
    vae = VAE(ckpt_path) if output_vae else None
    return model, clip, vae, None
