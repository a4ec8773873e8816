"""Stand-in for ``comfy.model_patcher``: a model with the devices it loads onto."""

from __future__ import annotations

from typing import Any


class ModelPatcher:
    def __init__(
        self, model: Any, load_device: str = "cuda:0", offload_device: str = "cpu"
    ) -> None:
        self.model = model
        self.load_device = load_device
        self.offload_device = offload_device

    def clone(self) -> ModelPatcher:
        return ModelPatcher(self.model, self.load_device, self.offload_device)
