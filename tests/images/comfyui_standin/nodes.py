"""Stand-in for ComfyUI's ``nodes``: the checkpoint loader node and the custom node loader."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from typing import Any

import comfy.sd
import folder_paths


class CheckpointLoaderSimple:
    @classmethod
    def INPUT_TYPES(s) -> dict[str, Any]:
        return {"required": {"ckpt_name": (folder_paths.get_filename_list("checkpoints"),)}}

    RETURN_TYPES = ("MODEL", "CLIP", "VAE")
    FUNCTION = "load_checkpoint"
    CATEGORY = "loaders"

    def load_checkpoint(self, ckpt_name: str) -> tuple[Any, ...]:
        ckpt_path = folder_paths.get_full_path_or_raise("checkpoints", ckpt_name)
        out = comfy.sd.load_checkpoint_guess_config(
            ckpt_path,
            output_vae=True,
            output_clip=True,
            embedding_directory=folder_paths.get_folder_paths("embeddings"),
        )
        return out[:3]


NODE_CLASS_MAPPINGS: dict[str, Any] = {"CheckpointLoaderSimple": CheckpointLoaderSimple}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}


def load_custom_node(module_path: str, module_name: str | None = None) -> bool:
    """As ComfyUI loads a package from custom_nodes/: its __init__.py by file location, under
    its directory name (``module_name`` overrides it, so a test can load it afresh)."""
    module_name = module_name or os.path.basename(module_path)
    spec = importlib.util.spec_from_file_location(
        module_name, os.path.join(module_path, "__init__.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    mappings = getattr(module, "NODE_CLASS_MAPPINGS", None)
    if mappings is None:
        logging.warning(
            "Skip %s module for custom nodes due to the lack of NODE_CLASS_MAPPINGS.", module_path
        )
        return False
    NODE_CLASS_MAPPINGS.update(mappings)
    NODE_DISPLAY_NAME_MAPPINGS.update(getattr(module, "NODE_DISPLAY_NAME_MAPPINGS", {}))
    return True
