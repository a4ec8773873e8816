"""The node types the demo engine offers, as ComfyUI's ``GET /object_info`` describes them:
those of ComfyUI's default text-to-image workflow, so that its web page can build that graph and
queue it. The engine renders whatever the graph asks (graph.py); the inputs here are what the
page shows and checks."""

from __future__ import annotations

from typing import Any, Final

CHECKPOINTS: Final = (
    "v1-5-pruned-emaonly-fp16.safetensors",  # the name ComfyUI's default workflow asks for
    "demo.safetensors",
)
"""What a Load Checkpoint node may pick; every name loads the engine's one checkpoint."""
SAMPLERS: Final = ("euler", "euler_ancestral", "dpmpp_2m", "ddim")
SCHEDULERS: Final = ("normal", "karras", "simple")
_SEED_MAX: Final = 0xFFFFFFFFFFFFFFFF


def _node(
    name: str,
    category: str,
    required: dict[str, Any],
    output: list[str],
    *,
    display: str,
    output_node: bool = False,
    hidden: dict[str, str] | None = None,
) -> dict[str, Any]:
    inputs: dict[str, Any] = {"required": required}
    if hidden:
        inputs["hidden"] = hidden
    return {
        "input": inputs,
        "input_order": {kind: list(values) for kind, values in inputs.items()},
        "output": output,
        "output_is_list": [False] * len(output),
        "output_name": output,
        "name": name,
        "display_name": display,
        "description": "",
        "python_module": "nodes",
        "category": category,
        "output_node": output_node,
    }


def object_info() -> dict[str, dict[str, Any]]:
    """The body of ``GET /object_info``."""
    int_ = "INT"
    nodes = [
        _node(
            "CheckpointLoaderSimple",
            "loaders",
            {"ckpt_name": [list(CHECKPOINTS), {}]},
            ["MODEL", "CLIP", "VAE"],
            display="Load Checkpoint",
        ),
        _node(
            "CLIPTextEncode",
            "conditioning",
            {"text": ["STRING", {"multiline": True, "dynamicPrompts": True}], "clip": ["CLIP"]},
            ["CONDITIONING"],
            display="CLIP Text Encode (Prompt)",
        ),
        _node(
            "KSampler",
            "sampling",
            {
                "model": ["MODEL"],
                "seed": [
                    int_,
                    {"default": 0, "min": 0, "max": _SEED_MAX, "control_after_generate": True},
                ],
                "steps": [int_, {"default": 20, "min": 1, "max": 10000}],
                "cfg": [
                    "FLOAT",
                    {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01},
                ],
                "sampler_name": [list(SAMPLERS), {}],
                "scheduler": [list(SCHEDULERS), {}],
                "positive": ["CONDITIONING"],
                "negative": ["CONDITIONING"],
                "latent_image": ["LATENT"],
                "denoise": ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01}],
            },
            ["LATENT"],
            display="KSampler",
        ),
        _node(
            "EmptyLatentImage",
            "latent",
            {
                "width": [int_, {"default": 512, "min": 16, "max": 2048, "step": 8}],
                "height": [int_, {"default": 512, "min": 16, "max": 2048, "step": 8}],
                "batch_size": [int_, {"default": 1, "min": 1, "max": 64}],
            },
            ["LATENT"],
            display="Empty Latent Image",
        ),
        _node(
            "VAEDecode",
            "latent",
            {"samples": ["LATENT"], "vae": ["VAE"]},
            ["IMAGE"],
            display="VAE Decode",
        ),
        _node(
            "SaveImage",
            "image",
            {"images": ["IMAGE"], "filename_prefix": ["STRING", {"default": "ComfyUI"}]},
            [],
            display="Save Image",
            output_node=True,
            hidden={"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        ),
        _node(
            "PreviewImage",
            "image",
            {"images": ["IMAGE"]},
            [],
            display="Preview Image",
            output_node=True,
            hidden={"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"},
        ),
    ]
    return {node["name"]: node for node in nodes}
