"""``wgp_config.json``: Wan2GP's server config in its working directory, written before it starts.

Wan2GP reads its preload policy, the model it opens with and where it looks for weights from this
file (not from flags), and writes a full default one only when none exists. The launcher merges
the environment's wishes into the file that is there, or into Wan2GP's defaults.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULTS: dict[str, Any] = {
    "attention_mode": "auto",
    "transformer_types": [],
    "transformer_quantization": "int8",
    "text_encoder_quantization": "int8",
    "save_path": "outputs",
    "image_save_path": "outputs",
    "compile": "",
    "metadata_type": "metadata",
    "boost": 1,
    "clear_file_list": 5,
    "vae_config": 0,
    "profile": 4,
    "preload_model_policy": [],
    "UI_theme": "default",
    "checkpoints_paths": ["ckpts", "."],
    "queue_color_scheme": "pastel",
    "model_hierarchy_type": 1,
}
"""What wgp.py writes when it finds no file (it indexes some of these keys directly)."""

_ON = {"1", "true", "yes", "on"}
_OFF = {"", "0", "false", "no", "off"}


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Settings:
    eager: bool | None
    """EAGER_LOAD_MODEL: 1 preloads the model at start ("P"), and never unloads it when the
    queue is done ("U" would drop the weights after each batch of renders); 0 takes "P" out
    (an earlier run's 1 left it in the file); unset (``None``): the file decides."""
    model: str | None
    """WAN2GP_MODEL: the model type wgp.py opens with, and so preloads (``last_model_type``)."""
    checkpoints: tuple[str, ...]
    """WAN2GP_CHECKPOINTS: folders searched for weights, in order; the first is where missing
    files would be downloaded to."""
    offline: bool = False
    """HF_HUB_OFFLINE: huggingface_hub downloads nothing, so a missing file fails the start."""


def settings_from(environ: Mapping[str, str]) -> Settings:
    """The one reader of the launcher's environment."""
    flag = environ.get("EAGER_LOAD_MODEL", "").strip().lower()
    if flag not in _ON | _OFF:
        raise SettingsError(f"EAGER_LOAD_MODEL={environ['EAGER_LOAD_MODEL']!r}: expected 1 or 0")
    model = environ.get("WAN2GP_MODEL", "").strip() or None
    paths = environ.get("WAN2GP_CHECKPOINTS", "").split(",")
    return Settings(
        eager=None if "EAGER_LOAD_MODEL" not in environ else flag in _ON,
        model=model,
        checkpoints=tuple(p.strip() for p in paths if p.strip()),
        offline=environ.get("HF_HUB_OFFLINE", "").strip().lower() in _ON,
    )


def merged(existing: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    config = dict(existing) if existing else dict(DEFAULTS)
    policy = list(config.get("preload_model_policy") or [])
    if settings.eager:
        config["preload_model_policy"] = ["P", *(p for p in policy if p not in ("P", "U"))]
    elif settings.eager is False:
        config["preload_model_policy"] = [p for p in policy if p != "P"]
    if settings.model is not None:
        config["last_model_type"] = settings.model
    if settings.checkpoints:
        config["checkpoints_paths"] = list(settings.checkpoints)
    return config


def preloads(config: Mapping[str, Any]) -> bool:
    """Whether wgp.py will preload its model with this config (what ``/readyz`` calls eager)."""
    return "P" in (config.get("preload_model_policy") or [])


def write(path: Path, settings: Settings) -> dict[str, Any]:
    """Merge ``settings`` into the file at ``path`` (replaced atomically); returns what it wrote."""
    existing = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config = merged(existing, settings)
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    os.replace(scratch, path)
    return config
