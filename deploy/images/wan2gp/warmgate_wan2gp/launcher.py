"""Runs wgp.py and serves ``/readyz`` beside it, on a port of its own.

    python -m warmgate_wan2gp [--ready-port 7861] [--config wgp_config.json] -- python wgp.py ...

1. merges the environment into ``wgp_config.json`` (wgpconfig.py);
2. starts the command, its output passed through to ours line by line and watched for Wan2GP's
   ``Loading ...`` lines;
3. asks the app ``GET /config`` on its port until it answers 200: from then on ``/readyz`` is 200;
4. on SIGTERM or SIGINT sends wgp.py SIGINT (Gradio closes its server and runs wgp.py's exit
   handlers), then SIGKILL after ``--stop-grace``, and exits 0;
5. when wgp.py exits on its own (a failed preload raises before the port opens) it logs why,
   with wgp.py's last lines; ``/readyz`` answers ``503 {"stage": "failed", "error": ...}`` with
   the line that says why for ``--failed-linger`` more (or until SIGTERM), and the launcher
   exits with wgp.py's code (1 if that was 0): the container restarts, and ``/readyz`` was
   never 200. One that died in Gradio's launch check (after its app answered) exits at once,
   the exception as its last line of stderr: a new start may well pass the check.

Only the standard library: it runs in the engine's image, next to whatever Wan2GP installs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections import deque
from pathlib import Path
from typing import Any

from . import readiness, wgpconfig
from .readiness import Readiness

PREFIX = "warmgate-wan2gp:"


def say(message: str) -> None:
    print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m warmgate_wan2gp",
        description="Run Wan2GP's wgp.py and serve /readyz: 200 once its preload finished.",
    )
    parser.add_argument("--ready-host", default="0.0.0.0", help="default %(default)s")
    parser.add_argument("--ready-port", type=int, default=7861, help="default %(default)s")
    parser.add_argument(
        "--config", default="wgp_config.json", help="wgp.py's config, relative to --cwd"
    )
    parser.add_argument("--cwd", default=".", help="wgp.py's working directory")
    parser.add_argument("--probe-path", default="/config", help="asked of the app: Gradio's config")
    parser.add_argument("--probe-interval", type=float, default=0.5, help="seconds")
    parser.add_argument(
        "--launch-check",
        type=float,
        default=3.5,
        help="seconds from the app's first answer to ready: Gradio's launch() then checks "
        "HEAD / with a 3 s timeout and exits when it times out (default %(default)s)",
    )
    parser.add_argument("--stop-grace", type=float, default=25.0, help="SIGINT to SIGKILL, seconds")
    parser.add_argument(
        "--failed-linger",
        type=float,
        default=120.0,
        help="seconds /readyz still says failed after wgp.py exited on its own (SIGTERM: less)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python wgp.py ...")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command: -- python wgp.py ...")
    return args


class Launcher:
    def __init__(
        self, args: argparse.Namespace, settings: wgpconfig.Settings, config: dict[str, Any]
    ) -> None:
        """``config``: the ``wgp_config.json`` written for wgp.py."""
        self.args = args
        self.settings = settings
        self.folders = [str(path) for path in config.get("checkpoints_paths") or []]
        self.state = Readiness(eager=wgpconfig.preloads(config))
        self.port = readiness.app_port(args.command, dict(os.environ))
        self.tail: deque[str] = deque(maxlen=20)
        self.proc: asyncio.subprocess.Process | None = None
        self.in_launch = False
        """wgp.py died after its app answered, before ready: in Gradio's own launch check."""

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        server = await asyncio.start_server(self.serve, self.args.ready_host, self.args.ready_port)
        bound = server.sockets[0].getsockname()
        say(f"/readyz on {bound[0]}:{bound[1]}; starting {' '.join(self.args.command)}")
        # Handled before the start: wgp.py then starts with SIGINT at its default even where
        # ours was ignored (a background job of a shell), so SIGINT reaches Gradio's loop.
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            async with server:
                code = await self.supervise(stop)
                if self.state.stage == "failed" and not stop.is_set() and not self.in_launch:
                    await self.linger(stop)
                return code
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)

    async def linger(self, stop: asyncio.Event) -> None:
        """Keep saying failed, so that whoever probes ``/readyz`` learns why."""
        say(f"/readyz says failed for {self.args.failed_linger:g} s (or until SIGTERM)")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.args.failed_linger):
                await stop.wait()

    async def supervise(self, stop: asyncio.Event) -> int:
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.args.command,
                cwd=self.args.cwd,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as exc:
            say(f"cannot start {self.args.command[0]}: {exc}")
            return 127
        async with asyncio.TaskGroup() as tasks:
            output = tasks.create_task(self.pump())
            probe = tasks.create_task(self.probe())
            stopper = tasks.create_task(self.stop_on(stop))
            code = await self.proc.wait()
            await output
            probe.cancel()
            stopper.cancel()
        return self.finish(code)

    def finish(self, code: int) -> int:
        if self.state.stage == "stopping":
            say(f"wgp.py stopped (code {code})")
            return 0
        say(f"wgp.py exited with code {code} ({self.state.stage}); its last lines:")
        self.in_launch = self.state.stage == "launching"
        why = readiness.failure_line(self.tail)
        why = readiness.offline_hint(why, self.settings.offline, self.folders)
        self.state = readiness.exited(self.state, code, why)
        for line in self.tail:
            say(f"  {line}")
        if self.in_launch:
            # Its launch check timed out on a loaded host: a new start may pass it. Exit at once
            # (no linger) for whoever started it to start it again; the last line of stderr is
            # the exception, as it is, for that supervisor to tell (warmgate's process backend).
            say("it died in Gradio's launch check: exiting now, to be started again")
            if why:
                print(why, file=sys.stderr, flush=True)
        return code if code > 0 else 128 - code if code < 0 else 1

    async def pump(self) -> None:
        """wgp.py's output to ours as it comes; each line watched."""
        assert self.proc is not None and self.proc.stdout is not None
        lines = readiness.Lines()
        out = sys.stdout.buffer
        while chunk := await self.proc.stdout.read(65536):
            out.write(chunk)
            out.flush()
            for line in lines.feed(chunk):
                self.observe(line)
        for line in lines.close():
            self.observe(line)

    def observe(self, line: str) -> None:
        self.tail.append(line)
        before = self.state
        self.state = readiness.observe_line(before, line)
        if self.state.files != before.files:
            say(f"loading {self.state.files[-1]}")

    async def probe(self) -> None:
        """Ask the app until it answers 200 once."""
        while self.state.stage in ("starting", "loading"):
            if await self.app_answers():
                self.state = readiness.app_answered(self.state)
                say(f"the app answers on port {self.port}; its launch check runs")
                await asyncio.sleep(self.args.launch_check)
                self.state = readiness.launched(self.state)
                if self.state.stage == "ready":
                    say(f"ready: the app answers on port {self.port}")
                return
            await asyncio.sleep(self.args.probe_interval)

    async def app_answers(self) -> bool:
        request = (
            f"GET {self.args.probe_path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        try:
            async with asyncio.timeout(5):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                try:
                    writer.write(request)
                    head = await reader.readuntil(b"\r\n")
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return False
        return readiness.response_status(head) == 200

    async def stop_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        assert self.proc is not None
        self.state = readiness.stopping(self.state)
        say("stopping: SIGINT to wgp.py")
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(self.args.stop_grace):
                await self.proc.wait()
        except TimeoutError:
            say(f"wgp.py still running after {self.args.stop_grace:g} s: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            writer.close()
            return
        request = readiness.request_path(head)
        if request is None:
            status, body = 400, {"error": "not an HTTP/1.x request"}
        elif request[1] != "/readyz":
            status, body = 404, {"error": f"{request[1]}: only /readyz is served here"}
        else:
            status, body = readiness.answer(self.state)
        payload = json.dumps(body).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}
        writer.write(
            f"HTTP/1.1 {status} {reason[status]}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nCache-Control: no-store\r\n"
            "Connection: close\r\n\r\n".encode()
            + payload
        )
        with contextlib.suppress(OSError):
            await writer.drain()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = wgpconfig.settings_from(os.environ)
        config = wgpconfig.write(Path(args.cwd) / args.config, settings)
    except (wgpconfig.SettingsError, OSError, ValueError) as exc:
        say(f"cannot prepare {args.config}: {exc}")
        return 2
    say(
        f"preload policy {config.get('preload_model_policy')}, model "
        f"{config.get('last_model_type', '(wgp.py default)')}, weights from "
        f"{config.get('checkpoints_paths')}"
    )
    return asyncio.run(Launcher(args, settings, config).run())
