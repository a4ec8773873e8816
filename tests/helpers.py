"""Shared test parts: real servers on 127.0.0.1, and warmgate in-process or as a subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from router.config import Config, parse_config
from router.server import Server

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """Run an aiohttp app on a free loopback port; yields its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def one_target(name: str, spec: dict[str, Any], **target: Any) -> dict[str, Any]:
    """A config with the one target ``name`` (``spec``, its keys replaced by ``target``'s), on
    free loopback ports, without an access log."""
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {name: {**spec, **target}},
    }


def demo_engine(
    *more: str,
    size: str = "1MiB",
    render_seconds: float | None = 0.2,
    checkpoint: Path | None = None,
) -> list[str]:
    """The demo render engine's command line for the process backend: a ``size`` checkpoint (at
    ``checkpoint``, else the engine's own default place), ``render_seconds`` a render (None: the
    engine's default), then ``more`` of its flags."""
    command = ["python", "-m", "backends.demo_engine", "--port", "{port}"]
    command += ["--checkpoint-size", size]
    if checkpoint is not None:
        command += ["--checkpoint", str(checkpoint)]
    if render_seconds is not None:
        command += ["--render-seconds", str(render_seconds)]
    return [*command, *more]


def gradio_app(tmp_path: Path, python: str = "python", **env: str) -> dict[str, Any]:
    """The process backend of tests/gradio_app.py run by ``python``, offline and without
    telemetry, its files under ``tmp_path``; ``env`` adds to its environment."""
    return {
        "kind": "process",
        "command": [python, "-m", "tests.gradio_app", "--port", "{port}"],
        "cwd": str(ROOT),
        "env": {
            "GRADIO_ANALYTICS_ENABLED": "False",
            "GRADIO_TEMP_DIR": str(tmp_path / "gradio"),
            "HF_HUB_OFFLINE": "1",
            **env,
        },
        "stop_grace": "5s",
    }


def static_config(url: str, **target: Any) -> dict[str, Any]:
    spec = {"routes": [{"path_prefix": "/"}], "backend": {"kind": "static", "url": url}}
    return one_target("t", spec, **target)


class Running:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.url = f"http://127.0.0.1:{server.public_port}"
        self.admin = f"http://127.0.0.1:{server.admin_port}"

    def runtime(self, name: str = "t") -> Any:
        assert self.server.apps is not None
        from router.keys import RUNTIMES

        return self.server.apps.public[RUNTIMES][name]


@asynccontextmanager
async def warmgate(data: dict[str, Any], base_dir: str = ".") -> AsyncIterator[Running]:
    """warmgate in this process (its loop is the test's loop, so time can be fast-forwarded)."""
    config: Config = parse_config(data, "<test>", base_dir)
    server = Server(config)
    await server.start()
    try:
        yield Running(server)
    finally:
        await server.stop()


async def metric_value(admin: str, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(admin + "/metrics") as resp:
        text = await resp.text()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, rest = head.partition("{")
        if metric != name:
            continue
        got = dict(part.split("=", 1) for part in rest.rstrip("}").split(",") if "=" in part)
        if all(got.get(k) == f'"{v}"' for k, v in labels.items()):
            total += float(value)
    del want
    return total


class Subprocess:
    """warmgate as a real process (for signals, RSS and fd limits)."""

    def __init__(self, config: dict[str, Any], tmp: Path) -> None:
        self.public_port = free_port()
        self.admin_port = free_port()
        config = {
            **config,
            "listen": f"127.0.0.1:{self.public_port}",
            "admin_listen": f"127.0.0.1:{self.admin_port}",
        }
        self.path = tmp / "warmgate.yaml"
        self.path.write_text(yaml.safe_dump(config))
        self.log = tmp / "warmgate.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{self.public_port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"

    def start(self) -> Subprocess:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "router", "serve", "--config", str(self.path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("warmgate exited:\n" + self.log.read_text())
            try:
                with socket.create_connection(("127.0.0.1", self.admin_port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("warmgate did not start:\n" + self.log.read_text())

    def terminate(self, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


async def wait_until(
    predicate: Any,
    timeout: float = 10.0,  # noqa: ASYNC109 - a polling helper for tests: the deadline is its job
    interval: float = 0.02,
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


os.environ.setdefault("PYTHONUNBUFFERED", "1")
