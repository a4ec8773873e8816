"""`python -m backends.demo_engine --port PORT ...`: run the demo engine until SIGINT/SIGTERM.

aiohttp's run_app turns SIGTERM into a graceful shutdown (stop accepting, close websockets,
cancel the worker and any checkpoint load), after which the process exits with status 0.

The demo engine is a program of its own (warmgate starts it as a child, or a pod runs it), so it
reads its own environment here (``EAGER_LOAD_MODEL``, ``XDG_CACHE_HOME``, ...: see ``config``);
warmgate itself reads the environment only in ``router/config/env.py``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from aiohttp import web

from .config import parse_config
from .device import DeviceUnavailableError, resolve_torch
from .server import build_app

log = logging.getLogger("backends.demo_engine")


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    """SIGTERM before the event loop runs (e.g. during startup): still a clean exit."""
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_quietly)  # run_app replaces this once the loop runs
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = parse_config(argv, os.environ)
    try:
        torch = resolve_torch(config.device)
    except DeviceUnavailableError as exc:
        print(f"demo_engine: error: {exc}", file=sys.stderr)
        return 2
    app = build_app(config, torch=torch)
    log.info(
        "demo engine on %s:%d (checkpoint %s, %d bytes, %s, %s load, %.2fs/render)",
        config.host,
        config.port,
        config.checkpoint_path,
        config.checkpoint_size,
        config.device,
        "eager" if config.eager_load else "lazy",
        config.render_seconds,
    )
    web.run_app(
        app,
        host=config.host,
        port=config.port,
        shutdown_timeout=5.0,
        print=lambda message: log.info("%s", message.strip()),
        handle_signals=True,
    )
    log.info("demo engine stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
