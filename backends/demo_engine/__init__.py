"""The embedded default render engine: a small aiohttp server shaped like ComfyUI.

It loads a (synthetic) checkpoint into memory or VRAM, queues prompts in ComfyUI's API
format, "renders" procedural PNGs over a fixed wall-clock budget with progress and preview
frames on a websocket, and serves a small web UI. It exists so warmgate has a realistic
engine to cold-start, hold requests for, and proxy, without shipping a real model.
"""

from .config import EngineConfig, parse_config
from .server import build_app

__all__ = ["EngineConfig", "build_app", "parse_config"]
