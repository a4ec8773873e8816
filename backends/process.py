"""``kind: process``: a local command started and stopped by warmgate (one workstation, no
cluster). The child runs in its own process group, dies with warmgate (parent-death signal), and
its output goes to warmgate's log prefixed with the target name."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Coroutine, Iterable, Mapping
from pathlib import Path

from backends.base import Observation, ObservationListener
from backends.engines.common import engine_error, raised_line
from backends.outside import one_line
from backends.specs import READY_PORT, ProcessSpec

log = logging.getLogger("warmgate.process")

_PR_SET_PDEATHSIG = 1
_STDERR_TAIL = 20
_READ_SIZE = 64 * 1024
MAX_LINE = 8 * 1024
"""Longest log line of a child's output; a longer one is logged in pieces of this size."""
PYTHON = ("python", "python3")
"""The first word of a command (and the first after its ``--``) that means warmgate's own
interpreter."""
STDERR_WAIT = 1.0
"""Seconds a child's exit waits for the rest of its stderr to be read, for its reason."""
GROUP_POLL = 0.05
"""Seconds between two looks at whether a stopped child's process group is empty yet."""
KILL_WAIT = 5.0
"""Seconds a stop waits, after its SIGKILL, for the group's last members to end (the signal is
sent at once, a process takes a moment to die): the GPU is free when the stop returns."""
LISTEN_POLL = 0.1
"""Seconds between two looks at whether a starting child listens on its port yet: the stage
turns from ``starting`` to ``loading`` (its model loads until readiness passes)."""


class OutputLines:
    """A child's output split into log lines (sans-IO: bytes in, lines out). ``\\n`` and ``\\r``
    both end a line (tqdm redraws its progress bar with ``\\r`` for minutes and no newline);
    a line longer than :data:`MAX_LINE` is cut; empty lines are dropped."""

    __slots__ = ("_part",)

    def __init__(self) -> None:
        self._part = b""

    def feed(self, data: bytes) -> list[str]:
        pieces = (self._part + data).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._part = pieces.pop()
        out = [self._text(piece) for piece in pieces]
        while len(self._part) > MAX_LINE:
            cut = MAX_LINE
            while cut > MAX_LINE - 4 and self._part[cut] & 0xC0 == 0x80:
                cut -= 1  # never inside a UTF-8 character
            out.append(self._text(self._part[:cut]))
            self._part = self._part[cut:]
        return [text for text in out if text]

    def flush(self) -> list[str]:
        """What is left at the end of the output."""
        part, self._part = self._part, b""
        text = self._text(part)
        return [text] if text else []

    @staticmethod
    def _text(piece: bytes) -> str:
        return one_line(piece.decode(errors="replace"), MAX_LINE)


def exit_reason(code: int, stderr_tail: Iterable[str]) -> str:
    """Why a child ended, in one bounded line: its exit code and what it last said on stderr,
    the exception line of a Python traceback where it has one (``ModuleNotFoundError: No
    module named 'torch'``, not the ``Traceback`` above it), else its last line. Pure."""
    said = "\n".join(stderr_tail)
    why = f"exited with code {code}"
    return one_line(f"{why}: {engine_error(said)}") if said.strip() else why


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to SIGKILL the child when warmgate dies, even by SIGKILL; and let it hear
    SIGINT and SIGQUIT, which a shell ignores for a command it starts in the background (an
    ignored signal stays ignored across exec): a launcher's SIGINT is how its engine saves."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ProcessBackend:
    def __init__(
        self, target: str, spec: ProcessSpec, base_dir: str, *, environ: Mapping[str, str]
    ) -> None:
        """``environ``: the child's environment before ``spec.env`` is added (warmgate's own, as
        ``router/config/env.py`` read it)."""
        self.target = target
        self.spec = spec
        self.base_dir = base_dir
        self.environ = environ
        self._proc: asyncio.subprocess.Process | None = None
        self._logged_exit: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._observation = Observation()
        self._ready_urls: dict[str, str] = {}
        """The current child's endpoint -> its readiness listener (``{ready_port}``)."""
        self._listener: ObservationListener | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.stderr_tail: deque[str] = deque(maxlen=_STDERR_TAIL)
        self._lock = asyncio.Lock()

    @property
    def always_on(self) -> bool:
        return False

    def observe(self) -> Observation:
        return self._observation

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    def _set(self, observation: Observation) -> None:
        self._observation = observation
        if self._listener is not None:
            self._listener(observation)

    async def open(self, listener: ObservationListener) -> None:
        self._listener = listener
        listener(self._observation)

    def readiness_url(self, base_url: str) -> str | None:
        """:class:`backends.base.ChoosesReadyPort`: where the child's ``{ready_port}`` is."""
        return self._ready_urls.get(base_url)

    def _url(self, port: int) -> str:
        host = f"[{self.spec.host}]" if ":" in self.spec.host else self.spec.host
        return f"http://{host}:{port}"

    def _ready_port(self) -> int | None:
        """A free port when the command or env asks for ``{ready_port}``, at each start."""
        asked = [*self.spec.command, *self.spec.env.values()]
        return free_port(self.spec.host) if any(READY_PORT in part for part in asked) else None

    def _argv_env_cwd(
        self, port: int, ready_port: int | None = None
    ) -> tuple[list[str], dict[str, str], str]:
        values = {"port": str(port), "host": self.spec.host, "ready_port": str(ready_port)}
        argv = [part.format_map(values) for part in self.spec.command]
        if argv[0] in PYTHON:
            argv[0] = sys.executable  # the interpreter warmgate runs on, with its environment
            # A launcher module (``python -m launcher -- python app.py``) runs the command
            # after ``--`` on the same interpreter, not on whichever ``python`` PATH finds.
            after = argv.index("--") + 1 if "--" in argv else len(argv)
            if after < len(argv) and argv[after] in PYTHON:
                argv[after] = sys.executable
        env = dict(self.environ)
        env.update({k: v.format_map(values) for k, v in self.spec.env.items()})
        env.setdefault("PYTHONUNBUFFERED", "1")
        cwd = Path(self.base_dir, self.spec.cwd or ".").resolve()
        return argv, env, str(cwd)

    async def scale_up(self) -> None:
        async with self._lock:
            if self._proc is not None and self._proc.returncode is None:
                return
            port = self.spec.port or free_port(self.spec.host)
            ready_port = self._ready_port()
            argv, env, cwd = self._argv_env_cwd(port, ready_port)
            self.stderr_tail.clear()
            self._stopping = False
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                reason = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
                log.error("[%s] %s", self.target, reason)
                self._set(Observation(failure=reason, crashed=True))
                return
            self._proc = proc
            log.info("[%s] started pid %d: %s", self.target, proc.pid, " ".join(argv))
            url = self._url(port)
            self._ready_urls = {url: self._url(ready_port)} if ready_port is not None else {}
            self._set(Observation(running=True, endpoints=(url,), stage="starting"))
            assert proc.stdout is not None and proc.stderr is not None
            self._spawn(self._pipe(proc.stdout, "out"))
            stderr = self._spawn(self._pipe(proc.stderr, "err"))
            self._spawn(self._watch(proc, stderr))
            self._spawn(self._listening(proc, port if ready_port is None else ready_port))

    def _spawn(self, coro: Coroutine[None, None, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _pipe(self, stream: asyncio.StreamReader, name: str) -> None:
        """Log the child's output line by line, and never stop reading it: a child whose pipe
        is full blocks on its next write (its cold start would hang)."""
        lines = OutputLines()
        while True:
            try:
                chunk = await stream.read(_READ_SIZE)
            except Exception as exc:  # a broken pipe ends the output, never the drain silently
                log.warning("[%s] cannot read its std%s: %s", self.target, name, exc)
                return
            for text in lines.feed(chunk) if chunk else lines.flush():
                if name == "err":
                    self.stderr_tail.append(text)
                log.info("[%s] %s", self.target, text)
            if not chunk:
                return

    async def _listening(self, proc: asyncio.subprocess.Process, port: int) -> None:
        """``starting`` until the child accepts connections on ``port``, then ``loading``. A
        child with a ``{ready_port}`` is watched there: a launcher listens on it first, while
        its engine may open its own port only once its model is loaded (Wan2GP does)."""
        while proc.returncode is None and self._proc is proc and not self._stopping:
            try:
                _, writer = await asyncio.open_connection(self.spec.host, port)
            except OSError:
                await asyncio.sleep(LISTEN_POLL)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            observation = self._observation
            if self._proc is proc and observation.running and not self._stopping:
                self._set(dataclasses.replace(observation, stage="loading"))
            return

    async def _watch(self, proc: asyncio.subprocess.Process, stderr: asyncio.Task[None]) -> None:
        code = await proc.wait()
        if self._proc is not proc:
            return
        if self._stopping:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # leave no orphan of the group behind
        # Its last words may still be in the pipe (the group is gone: it ends soon); the
        # reason is read from them.
        await asyncio.wait([stderr], timeout=STDERR_WAIT)
        if self._proc is not proc or self._stopping:  # stopped or replaced meanwhile
            return
        self._logged_exit = proc  # the stop that follows has nothing left to say
        tail = "".join(f"\n  | {line}" for line in self.stderr_tail)  # never a record of its own
        reason = exit_reason(code, self.stderr_tail)
        log.warning("[%s] %s; last output:%s", self.target, reason, tail or " (none)")
        self._set(Observation(failure=reason, crashed=True, last_error=self.last_error()))

    def last_error(self) -> str | None:
        """The exception the child's stderr ended with (what held requests are told)."""
        return raised_line(self.stderr_tail)

    async def scale_down(self, deadline: float | None = None) -> None:
        async with self._lock:
            proc = self._proc
            self._stopping = True
            if proc is not None:
                await self._terminate(proc)
            self._set(Observation())

    async def _terminate(self, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM to the command alone first: a launcher that handles it stops its engine its
        own way (the Wan2GP launcher sends wgp.py SIGINT, so its exit handlers run), which a
        SIGTERM to the whole group would cut short. Once it exited, what is left of its group
        gets SIGTERM; SIGKILL to the group once ``stop_grace`` is spent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.spec.stop_grace
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout_at(deadline):
                await proc.wait()
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)  # a shell's engine, a worker left over
                await _group_ended(proc.pid)
        except TimeoutError:
            log.warning(
                "[%s] still running %.0fs after SIGTERM: SIGKILL", self.target, self.spec.stop_grace
            )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_WAIT):
                await _group_ended(proc.pid)
        if self._logged_exit is not proc:  # each child's end is logged once
            self._logged_exit = proc
            log.info("[%s] stopped (exit code %s)", self.target, proc.returncode)

    async def close(self) -> None:
        await self.scale_down()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _group_ended(pgid: int) -> None:
    """Until no member of process group ``pgid`` is left (signal 0 finds none)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        while True:
            os.killpg(pgid, 0)
            await asyncio.sleep(GROUP_POLL)
