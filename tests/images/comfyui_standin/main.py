"""Stand-in for ComfyUI's ``main.py``, for the image built around a stand-in source: the same
arguments deploy/ passes, the custom nodes of ``custom_nodes/`` loaded as ComfyUI loads them,
the routes added, the server listening until the process ends."""

from __future__ import annotations

import argparse
import asyncio
import os

import nodes
import server

parser = argparse.ArgumentParser()
parser.add_argument("--listen", nargs="?", const="0.0.0.0", default="127.0.0.1")
parser.add_argument("--port", type=int, default=8188)
parser.add_argument("--extra-model-paths-config", action="append", default=[])
args, _ = parser.parse_known_args()


def custom_nodes() -> list[str]:
    folders = (os.path.join("custom_nodes", name) for name in sorted(os.listdir("custom_nodes")))
    return [path for path in folders if os.path.isfile(os.path.join(path, "__init__.py"))]


async def main() -> None:
    prompt_server = server.PromptServer(asyncio.get_running_loop())
    for path in custom_nodes():
        nodes.load_custom_node(path)
    prompt_server.add_routes()
    await prompt_server.start_multi_address([(args.listen, args.port)])
    print(f"To see the GUI go to: http://{args.listen}:{args.port}", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
