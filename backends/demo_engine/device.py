"""The accelerator the checkpoint lives on: resolving it at start, describing it afterwards.

torch is optional and imported lazily through importlib, so the engine runs (on CPU) without it.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from .config import Device


class DeviceUnavailableError(RuntimeError):
    """The requested device cannot be used on this machine."""


def resolve_torch(device: Device) -> Any | None:
    """Return the torch module for `cuda`, None for `cpu`; fail clearly if CUDA is unusable."""
    if device == "cpu":
        return None
    try:
        torch = importlib.import_module("torch")
    except ImportError as exc:
        raise DeviceUnavailableError(
            "--device cuda needs PyTorch, but `import torch` failed: " + str(exc)
        ) from exc
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            "--device cuda was requested but torch.cuda.is_available() is False "
            "(no GPU visible, or a CPU-only torch build)"
        )
    return torch


def _host_memory() -> tuple[int, int]:
    """(total, available) bytes of host RAM, or zeros where sysconf cannot say."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0, 0


def describe_devices(torch: Any | None) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """ComfyUI-shaped RAM figures and `devices` list for /system_stats."""
    ram_total, ram_free = _host_memory()
    ram = {"ram_total": ram_total, "ram_free": ram_free}
    if torch is None:
        cpu = {
            "name": "cpu",
            "type": "cpu",
            "index": None,
            "vram_total": ram_total,
            "vram_free": ram_free,
            "torch_vram_total": ram_total,
            "torch_vram_free": ram_free,
        }
        return ram, [cpu]
    index = int(torch.cuda.current_device())
    free, total = (int(v) for v in torch.cuda.mem_get_info(index))
    reserved = int(torch.cuda.memory_reserved(index))
    allocated = int(torch.cuda.memory_allocated(index))
    gpu = {
        "name": f"cuda:{index} {torch.cuda.get_device_name(index)}",
        "type": "cuda",
        "index": index,
        "vram_total": total,
        "vram_free": free,
        "torch_vram_total": reserved,
        "torch_vram_free": reserved - allocated,
    }
    return ram, [gpu]
