"""``engine: gradio``: a Gradio app (Wan2GP runs on Gradio 5.x).

- **Ready**: ``GET /config`` answers 200 and has for :data:`LAUNCH_CHECK` (Gradio's ``launch()``
  checks ``HEAD /`` after its app first answers, and exits when that check times out: a burst of
  page loads let through meanwhile killed Wan2GP; nothing in the app says the check is over);
  then, with ``warmup: {api_name, data}``, one call
  through the app's API (``POST {api}/call/<api_name>``, then its event stream until
  ``complete``) before the target counts as ready: an app that loads its model on the first
  generation has it resident before the first person waits.
- **Busy**: a ``queue/data`` event stream is activity while a job it carries is unfinished
  (``jobs``: from ``estimation`` or ``process_starts`` until ``process_completed``), however
  rarely it speaks; not for its whole life, since Gradio's page may leave one open that carries
  only heartbeats with no job behind it. A ``call/<api_name>/<event_id>`` stream lasts exactly
  as long as its job and is activity for its whole life. Jobs still waiting in Gradio's queue
  are polled too (``{api}/queue/status`` -> ``queue_size``, the jobs waiting, not those
  running): that is also the queue depth the API policy reads.
- **Not activity**: ``{api}/heartbeat/<session>`` streams stay open for a tab's whole life. They
  are never cut while the target is up either: Gradio cancels a session's jobs when its heartbeat
  drops. They are closed only when the target is released.
- **Ended by warmgate** (a release, a shutdown): a ``queue/data`` stream gets Gradio's own
  ``{"msg": "close_stream"}`` first, as Gradio ends it; Gradio's page marks its stream closed only
  then, and opens a new one for its next job only if it did (else a click after a release spins
  for good).
- **Wakes**: anything but a websocket, a heartbeat reconnecting, or a ``queue/data`` stream (a
  session of a process that is gone); so ``gradio_client`` (which starts with ``GET /config``)
  wakes a cold target and is held through the cold start.
- **Answers JSON** to ``gradio_client``'s calls made with httpx's 5 s read timeout
  (``/config``, ``{api}/info``, ``upload``, ``queue/join``, ``call/<api_name>``): held through
  a start, their answer begins at once and whitespace keeps the client reading
  (router/routing/padded.py).

``{api}`` is the app's ``api_prefix`` from ``/config`` (``/gradio_api`` since Gradio 5).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Final

import aiohttp

from backends.base import RequestFacts, StreamActivity
from backends.engines.common import (
    PROBE_ERRORS,
    WARMUP_REQUEST_TIMEOUT,
    EngineBase,
    Warmup,
    WarmupFailed,
    engine_error,
)
from backends.outside import count
from backends.specs import EngineSpec, GradioWarmup

CLOSE_STREAM: Final = b'data: {"msg":"close_stream","event_id":null}\n\n'
"""The event Gradio ends a ``queue/data`` stream with (``CloseStreamMessage``, as it writes it)."""

LAUNCH_CHECK: Final = 3.5
"""Seconds from the app's first answer to its launch being over: Gradio's own ``HEAD /`` check
(made right after its startup events) times out at 3 s, and the launch fails then."""

DEFAULT_API_PREFIX: Final = "/gradio_api"
"""Gradio 5's; replaced by ``api_prefix`` from ``/config`` once the app answered."""


def is_heartbeat(path: str) -> bool:
    return "/heartbeat/" in path


def is_queue_stream(path: str) -> bool:
    """A session's ``queue/data`` stream: its jobs' messages, and heartbeats."""
    return path.rstrip("/").endswith("/queue/data")


def is_call_stream(path: str) -> bool:
    """A stream that lasts exactly as long as its job: ``call/<api_name>/<event_id>``."""
    return "/call/" in path


def sse_events(buffer: str) -> tuple[list[tuple[str, str]], str]:
    """Complete ``(event, data)`` pairs in ``buffer``, and what is left of it."""
    events: list[tuple[str, str]] = []
    *blocks, rest = buffer.replace("\r\n", "\n").split("\n\n")
    for block in blocks:
        event, data = "message", []
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
        if data or event != "message":
            events.append((event, "\n".join(data)))
    return events, rest


class GradioEngine(EngineBase):
    default_ready_path = "/config"

    def __init__(self, spec: EngineSpec) -> None:
        super().__init__(spec)
        self.api_prefix = DEFAULT_API_PREFIX
        self._answered_at: dict[str, float] = {}
        """Endpoint -> loop time its ``/config`` first answered in this start."""
        self.call: GradioWarmup | None = spec.warmup
        if self.call is not None:
            self.warmup = Warmup("gradio", self._warm_up)

    async def probe_ready(self, base_url: str) -> bool:
        if self.ready_path != self.default_ready_path or self.readiness.port is not None:
            return await super().probe_ready(base_url)
        now = asyncio.get_running_loop().time()
        answered = self._answered_at.get(base_url)
        if answered is not None and now - answered < LAUNCH_CHECK:
            return False  # Gradio's launch may still be checking HEAD /: not one more request
        config = await self.get_json(base_url, self.ready_path)
        if not isinstance(config, dict):
            self._answered_at.pop(base_url, None)
            return False
        prefix = config.get("api_prefix")
        self.api_prefix = "/" + prefix.strip("/") if isinstance(prefix, str) and prefix else ""
        if answered is None:
            self._answered_at[base_url] = now
            return False
        if self.warmup is not None and not self.warmup.done(base_url):
            return False
        del self._answered_at[base_url]  # reported once: the next start waits again
        return True

    async def _warm_up(self, base_url: str) -> None:
        assert self.call is not None
        url = f"{base_url}{self.api_prefix}/call/{self.call.api_name}"
        timeout = aiohttp.ClientTimeout(total=WARMUP_REQUEST_TIMEOUT)
        async with self.client().post(url, json={"data": self.call.data}, timeout=timeout) as r:
            text = await r.text()
            if r.status != 200:
                said = engine_error(text)
                raise WarmupFailed(f"{self.call.api_name} answered {r.status}: {said}")
            try:
                event_id = str(json.loads(text)["event_id"])
            except (ValueError, KeyError, TypeError) as exc:
                raise WarmupFailed(f"{self.call.api_name} answered {engine_error(text)!r}") from exc
        # The job's own stream: no total timeout (cold_start_timeout bounds the whole start).
        stream = aiohttp.ClientTimeout(total=None, sock_connect=self.readiness.timeout)
        async with self.client().get(f"{url}/{event_id}", timeout=stream) as r:
            if r.status != 200:
                raise WarmupFailed(f"GET {url}/{event_id} answered {r.status}")
            buffer = ""
            async for chunk in r.content.iter_any():
                events, buffer = sse_events(buffer + chunk.decode("utf-8", "replace"))
                for event, data in events:
                    if event == "complete":
                        return
                    if event == "error":
                        said = engine_error(data) if data and data != "null" else "error"
                        raise WarmupFailed(f"{self.call.api_name}: {said}")
        raise aiohttp.ServerDisconnectedError("the warm-up stream ended without a result")

    async def busy(self, base_url: str) -> bool:
        return await self.busy_from(self._queued(base_url))

    async def _queued(self, base_url: str) -> bool | None:
        try:
            status: Any = await self.get_json(base_url, f"{self.api_prefix}/queue/status")
            said = status["queue_size"]
        except (*PROBE_ERRORS, KeyError, TypeError):
            return self.heard_queue(base_url, None)
        depth = count(said)
        if depth is None:
            self.refused(base_url, "queue_size", said)
        return self.heard_queue(base_url, depth)

    def request_wakes(self, facts: RequestFacts) -> bool:
        return not (is_heartbeat(facts.path) or is_queue_stream(facts.path))

    def stream_activity(self, path: str) -> StreamActivity:
        if is_heartbeat(path):
            return "none"
        if is_queue_stream(path):
            return "jobs"
        return "open" if is_call_stream(path) else "frames"

    def stream_farewell(self, path: str) -> bytes | None:
        return CLOSE_STREAM if is_queue_stream(path) else None

    def json_answer(self, method: str, path: str) -> bool:
        """What ``gradio_client`` asks with httpx's 5 s read timeout: the app's config, its API
        description, a file's upload, a job's submission (``queue/join``, ``call/<api_name>``);
        not the streams, which it reads without one."""
        path = path.rstrip("/")
        api = self.api_prefix
        if method == "GET":
            return path in ("/config", f"{api}/info")
        if method != "POST":
            return False
        call = path.removeprefix(f"{api}/call/")
        if call != path:
            return bool(call) and "/" not in call
        return path in (f"{api}/queue/join", f"{api}/upload")
