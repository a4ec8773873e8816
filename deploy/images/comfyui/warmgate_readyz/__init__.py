"""warmgate's ComfyUI custom node: ``GET /readyz`` (and ``/api/readyz``) that answers 200 only
once the checkpoints named in ``EAGER_CHECKPOINTS`` are in VRAM, loaded at start when
``EAGER_LOAD_MODEL=1``. It adds no node to the graph and no frontend file. See README.md.

ComfyUI imports this package from ``custom_nodes/`` while it starts, before its server listens:
the route goes on ``PromptServer.instance.routes`` (ComfyUI serves every route of that table under
``/api`` too), the eager load starts on its own thread, and the server comes up meanwhile,
answering 503 with the progress.
"""

from __future__ import annotations

import os
from typing import Any

from . import readiness
from .eager import EagerLoad, hand_over


def install(environ: Any = os.environ) -> EagerLoad:
    """Read the settings, register ``/readyz``, hand eagerly loaded checkpoints over to
    ``CheckpointLoaderSimple`` and start the load. The one reader of the environment."""
    import nodes
    import server
    from aiohttp import web

    loader_class = nodes.CheckpointLoaderSimple
    original = loader_class.load_checkpoint
    eager = EagerLoad(readiness.settings_from(environ), load=lambda n: original(loader_class(), n))
    hand_over(loader_class, eager)

    async def readyz(request: web.Request) -> web.Response:
        state = eager.state
        in_vram = eager.in_vram() if state.stage == "ready" else frozenset()
        status, body = readiness.answer(state, in_vram)
        return web.json_response(body, status=status, headers={"Cache-Control": "no-store"})

    server.PromptServer.instance.routes.get("/readyz")(readyz)
    eager.start()
    return eager


EAGER = install()

NODE_CLASS_MAPPINGS: dict[str, type] = {}
"""No node of its own: ComfyUI still needs the name to count the package as loaded."""
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
