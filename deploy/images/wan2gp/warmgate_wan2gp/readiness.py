"""What the launcher's ``/readyz`` answers, and how it learns it: pure functions, no I/O.

Wan2GP has no readiness endpoint, but its start has a fixed order: ``wgp.py`` reads
``wgp_config.json``, and when its ``preload_model_policy`` holds ``"P"`` it loads the model at
module level (printing ``Loading Model '<file>' ...`` for each file), and only then builds the UI
and calls ``launch()``, which opens the Gradio port. So with the preload policy set, the port
answering means the preload finished; a preload that fails raises before the port ever opens and
the process exits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

_LOADING = re.compile(r"^Loading (?:Model|Module|Text Encoder) '(?P<name>[^']+)' \.\.\.")


@dataclass(frozen=True)
class Readiness:
    eager: bool
    stage: str = "starting"
    """starting (wgp.py importing) -> loading (a Loading line seen) -> launching (the app
    answered; Gradio's own launch check, ``HEAD /`` with a 3 s timeout, may still run) -> ready;
    failed (wgp.py exited; said until the launcher exits) and stopping (asked to stop) at any
    point."""
    files: tuple[str, ...] = ()
    """The weight files Wan2GP said it is loading, in order."""
    error: str | None = None


def observe_line(state: Readiness, line: str) -> Readiness:
    """One line of wgp.py's output."""
    match = _LOADING.match(line.strip())
    if match is None or state.stage not in ("starting", "loading"):
        return state
    return replace(state, stage="loading", files=(*state.files, match["name"]))


def app_answered(state: Readiness) -> Readiness:
    """The app answered its first request: launching, until its own launch check is over."""
    return replace(state, stage="launching") if state.stage in ("starting", "loading") else state


def launched(state: Readiness) -> Readiness:
    """Gradio's launch check is over: ready (a burst of page loads no longer kills it)."""
    return replace(state, stage="ready") if state.stage == "launching" else state


def exited(state: Readiness, code: int, why: str | None = None) -> Readiness:
    """wgp.py ended on its own; ``why``: the line of its output that says why
    (:func:`failure_line`)."""
    if state.stage == "stopping":
        return state
    error = f"wgp.py exited with code {code} ({state.stage})"
    return replace(state, stage="failed", error=f"{error}: {why}" if why else error)


_RAISED = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Exit|Interrupt)(?::|$)")
"""The last line of a Python traceback: ``module.SomeError: message``."""


def failure_line(lines: Iterable[str]) -> str | None:
    """The line of wgp.py's last output that says why it failed: the last exception it raised
    (a traceback's last line, not its top), else its last line."""
    kept = [line.strip() for line in lines if line.strip()]
    for line in reversed(kept):
        if _RAISED.match(line):
            return line
    return kept[-1] if kept else None


def offline_hint(why: str | None, offline: bool, folders: list[str]) -> str | None:
    """Wan2GP downloads a missing weight file, and offline huggingface_hub refuses it without
    naming the file: say where it was looked for, and why it was not fetched."""
    if why is None or not offline or "LocalEntryNotFoundError" not in why:
        return why
    return f"{why} (a weight file is in none of {folders}, and HF_HUB_OFFLINE forbids fetching it)"


def stopping(state: Readiness) -> Readiness:
    return replace(state, stage="stopping")


def message(state: Readiness) -> str:
    """Where the start is, in a person's words (what warmgate's waiting page shows)."""
    if state.stage == "loading" and state.files:
        count = f" (file {len(state.files)})" if len(state.files) > 1 else ""
        return f"loading {state.files[-1]}{count}"
    return {
        "starting": "wgp.py starting",
        "launching": "the app answers; Gradio's launch check runs",
        "stopping": "stopping",
    }.get(state.stage, "")


def answer(state: Readiness) -> tuple[int, dict[str, Any]]:
    """HTTP status and JSON body of ``GET /readyz``. Wan2GP reports no fraction of its load,
    so ``progress`` is said only once ready (1): a 0 while it loads would be read as one (a
    bar standing still); ``message`` says where the start is."""
    ready = state.stage == "ready"
    body: dict[str, Any] = {
        "stage": state.stage,
        "loaded": list(state.files) if ready else [],
        "eager": state.eager,
    }
    if ready:
        body["progress"] = 1.0
    said = message(state)
    if said:
        body["message"] = said
    if state.stage == "loading":
        body["loading"] = list(state.files)
    if state.error is not None:
        body["error"] = state.error
    return (200 if ready else 503), body


def app_port(command: list[str], environ: dict[str, str]) -> int:
    """The port wgp.py will listen on, as it decides: ``--server-port``, else ``SERVER_PORT``,
    else 7860."""
    for i, arg in enumerate(command):
        if arg == "--server-port" and i + 1 < len(command) and int(command[i + 1]):
            return int(command[i + 1])
        if arg.startswith("--server-port=") and int(arg.split("=", 1)[1]):
            return int(arg.split("=", 1)[1])
    return int(environ.get("SERVER_PORT", "7860"))


class Lines:
    """Splits output bytes into lines (``\\n`` or ``\\r``, as progress bars redraw); a line
    longer than ``limit`` is cut there."""

    def __init__(self, limit: int = 65536) -> None:
        self._buffer = b""
        self._limit = limit

    def feed(self, data: bytes) -> list[str]:
        parts = re.split(rb"[\r\n]", self._buffer + data)
        self._buffer = parts.pop()[-self._limit :]
        return [p[: self._limit].decode("utf-8", "replace") for p in parts if p]

    def close(self) -> list[str]:
        rest, self._buffer = self._buffer, b""
        return [rest.decode("utf-8", "replace")] if rest else []


def request_path(head: bytes) -> tuple[str, str] | None:
    """Method and path of an HTTP/1.x request head, or None if it is not one."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    return parts[0], parts[1].split("?", 1)[0]


def response_status(head: bytes) -> int | None:
    """Status code of an HTTP/1.x response head, or None."""
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        return None
    return int(parts[1])
