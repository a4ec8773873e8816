"""What every engine shares: a small HTTP client for its own probes, the readiness path, the
frame of the wake rules, and the warm-up run once per start of the workload.

The router speaks to engines only through :class:`backends.base.Engine`; the engines here fill
in the engine-specific parts (:meth:`EngineBase.request_wakes`, :meth:`EngineBase.busy`,
:meth:`EngineBase.stream_activity`, a warm-up coroutine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, ClassVar, Final

import aiohttp
from yarl import URL

from backends.base import ChoosesReadyPort, RequestFacts, StartFailed, StreamActivity
from backends.engines.parking import Parker
from backends.outside import number, one_line
from backends.specs import EngineSpec, ParkRequests, Readiness

log = logging.getLogger("warmgate.engine")

SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that only read; with ``wake_on: navigation`` they never wake a cold target."""

WARMUP_REQUEST_TIMEOUT: Final = 60.0
"""Seconds for one request that submits a warm-up (not for the warm-up's run itself, which is
bounded by the target's ``cold_start_timeout``)."""

PROBE_ERRORS: Final = (aiohttp.ClientError, TimeoutError, OSError, ValueError)
"""What a probe of a starting or busy engine may raise; all mean "no (useful) answer"."""


def progress_of(body: bytes) -> float | None:
    """The ``progress`` (0..1) of a JSON object body (``{"status": "loading", "progress":
    0.4}``); ``None`` when there is none, or it is not a number in range."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return number(data.get("progress"), 0.0, 1.0) if isinstance(data, dict) else None


def message_of(body: bytes) -> str:
    """The ``message`` of a JSON object body (``{"stage": "loading", "message": "loading
    wan2.1_t2v.safetensors"}``) as one bounded line; ``""`` when there is none, or it is not
    text."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    said = data.get("message") if isinstance(data, dict) else None
    return one_line(said) if isinstance(said, str) and said.strip() else ""


def readiness_at(readiness: Readiness, backend: object = None) -> Callable[[str], str]:
    """Where the readiness of the workload at a base URL is probed: ``readiness.port`` on the
    same host; ``{ready_port}``: where ``backend`` says (:class:`ChoosesReadyPort`)."""
    port = readiness.port
    if isinstance(port, int):
        return lambda base_url: str(URL(base_url).with_port(port))
    if port is not None and isinstance(backend, ChoosesReadyPort):
        return lambda base_url: backend.readiness_url(base_url) or base_url
    return lambda base_url: base_url


PROBE_PATHS: Final = frozenset({"/readyz", "/healthz", "/livez", "/health"})
"""Upstream paths of health and readiness probes (Kubernetes' and most engines' names); a
request for one never wakes a target (:meth:`EngineBase.is_probe`)."""

_RAISED: Final = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception)\b:?")


def engine_error(text: str) -> str:
    """The meaningful line of an engine's error body: a JSON ``detail``/``error``/``message``
    (or a JSON string), else the exception a traceback ends with (its last line, not its top),
    else the last line; cut to :data:`backends.outside.ERROR_CHARS`."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        data = next((data[k] for k in ("detail", "error", "message") if data.get(k)), None)
    if isinstance(data, str) and data.strip():
        text = data
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return one_line(raised_line(lines) or (lines or ["(no body)"])[-1])


def raised_line(lines: Iterable[str]) -> str | None:
    """The exception a traceback ends with (its last line, not its top), as one line; ``None``
    where no line names an exception (a plain message says too little to be told)."""
    raised = [line.strip() for line in lines if _RAISED.match(line.strip())]
    return one_line(raised[-1]) if raised else None


def failure_of(body: bytes) -> str | None:
    """The reason of a readiness answer that says the start failed (``{"stage": "failed",
    "error": "..."}``, as the images' ``/readyz`` answer when the model cannot load); ``None``
    for any other body."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("stage") != "failed":
        return None
    error = data.get("error")
    return str(error) if error else "its readiness answer says failed"


class WarmupFailed(StartFailed):
    """The engine answered, but its warm-up failed (a bad workflow, an error in the app).

    Raised from :meth:`EngineBase.probe_ready`: the cold start fails with this message instead of
    waiting for ``cold_start_timeout``."""


class Warmup:
    """Runs a warm-up once per start of the workload, in the background, so that a probe never
    blocks the lifecycle. Keyed by endpoint: a restarted workload (a new endpoint, or the same
    one after the previous warm-up was reported) is warmed up again."""

    def __init__(self, name: str, run: Callable[[str], Coroutine[Any, Any, None]]) -> None:
        self.name = name
        self._run = run
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def done(self, base_url: str) -> bool:
        """Start the warm-up for ``base_url`` if needed; True once it completed (reported once:
        the next start warms up again). Raises :class:`WarmupFailed` when it failed."""
        for url in [url for url in self._tasks if url != base_url]:
            self._tasks.pop(url).cancel()  # an endpoint of an earlier start
        task = self._tasks.get(base_url)
        if task is None:
            log.info("%s warm-up started at %s", self.name, base_url)
            self._tasks[base_url] = asyncio.get_running_loop().create_task(
                self._run(base_url), name=f"warmup:{self.name}"
            )
            return False
        if not task.done():
            return False
        del self._tasks[base_url]
        if task.cancelled():
            return False
        exc = task.exception()
        if isinstance(exc, WarmupFailed):
            raise WarmupFailed(f"{self.name} warm-up failed: {exc}") from exc
        if exc is not None:
            # The engine went away or stopped answering mid-warm-up: try again on the next probe
            # (a crash is seen by the backend; a hang by cold_start_timeout).
            log.warning("%s warm-up interrupted (%r); retrying", self.name, exc)
            return False
        log.info("%s warm-up completed at %s", self.name, base_url)
        return True

    async def close(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class EngineBase:
    """The generic parts of :class:`backends.base.Engine`."""

    default_ready_path: ClassVar[str] = "/readyz"
    """Probed unless ``readiness.path`` is set explicitly in the config."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.readiness = spec.readiness
        self.wake_on = spec.wake_on
        explicit = "path" in spec.readiness.model_fields_set
        self.ready_path = spec.readiness.path if explicit else self.default_ready_path
        self._explicit_ready_path = explicit and self.ready_path not in ("", "/")
        self.ready_at = readiness_at(spec.readiness)
        """The base URL readiness is probed at, from the workload's (``readiness.port``);
        replaced by :func:`backends.registry.make_engine` where the backend picks the port."""
        self.warmup: Warmup | None = None
        """Set by an engine with a configured warm-up."""
        self._session: aiohttp.ClientSession | None = None
        self._last_busy = False
        self._progress: dict[str, float] = {}
        """Load progress (0..1) by endpoint, from the last readiness answer that said one."""
        self._message: dict[str, str] = {}
        """The engine's words on its start by endpoint, from the last readiness answer."""
        self._queue: dict[str, int] = {}
        """The depth of the engine's own queue by endpoint, from the last busy poll that read
        one."""
        self.on_refused: Callable[[str], None] = lambda field: None
        """Told the field's name when a number the engine answered is no answer; the router
        counts it (:class:`backends.base.CountsRefusals`)."""
        self._refused: set[tuple[str, str]] = set()
        """(endpoint, field) already logged: a refusal is logged once, counted every time."""
        park = spec.park
        requests = park if isinstance(park, ParkRequests) else None
        if park == "auto":
            requests = self.auto_park()
        self.parker = Parker(spec.kind, requests) if requests is not None else None
        """How this engine is parked (docs/pools.md); ``None``: never, only stopped."""

    # -- the engine's own HTTP client (never through the proxy: probes are not activity) ----

    def client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.readiness.timeout),
                connector=aiohttp.TCPConnector(limit=4, force_close=True),
                trust_env=False,
            )
        return self._session

    async def get_ok(self, base_url: str, path: str) -> bool:
        try:
            async with self.client().get(base_url + path, allow_redirects=False) as response:
                await response.read()
                return response.status == 200
        except PROBE_ERRORS:
            return False

    def refused(self, base_url: str, field: str, value: object) -> None:
        """A number the engine answered for ``field`` (a name from this code) is out of its
        bounds (a 401-digit queue, NaN, a bool): it is no answer; counted, logged once per
        endpoint and field, never raised into the loop that polls."""
        self.on_refused(field)
        if (base_url, field) not in self._refused:
            self._refused.add((base_url, field))
            log.warning(
                "%s engine at %s answered %s=%s, out of its bounds: taken as no answer",
                self.spec.kind,
                one_line(base_url),
                field,
                one_line(f"{value!r:.60}"),
            )

    async def get_json(self, base_url: str, path: str) -> Any:
        """The JSON body of a 200 answer; ``None`` for any other answer or none at all."""
        try:
            async with self.client().get(base_url + path, allow_redirects=False) as response:
                if response.status != 200:
                    await response.read()
                    return None
                return await response.json(content_type=None)
        except PROBE_ERRORS:
            return None

    # -- the Engine protocol ---------------------------------------------------------------

    async def probe_ready(self, base_url: str) -> bool:
        if not await self.get_ready(base_url, self.ready_path):
            return False
        return self.warmup is None or self.warmup.done(base_url)

    async def get_ready(self, base_url: str, path: str) -> bool:
        """True for a 200; any other answer whose JSON body carries ``progress`` (0..1, as a
        ``/readyz`` 503 while the model loads) leaves it for :meth:`load_progress`, and its
        ``message`` for :meth:`load_message`; one that says ``"stage": "failed"`` raises
        :class:`StartFailed` with its ``error``."""
        url = self.ready_at(base_url) + path
        try:
            async with self.client().get(url, allow_redirects=False) as response:
                body = await response.read()
                ready = response.status == 200
        except PROBE_ERRORS:
            return False
        failure = None if ready else failure_of(body)
        said = "" if ready or failure is not None else message_of(body)
        if said:
            self._message[base_url] = said
        else:
            self._message.pop(base_url, None)  # an endpoint per start: none kept for nothing
        if failure is not None:
            self._progress.pop(base_url, None)
            raise StartFailed(failure)
        progress = None if ready else progress_of(body)
        if progress is None:
            self._progress.pop(base_url, None)
        else:
            self._progress[base_url] = progress
        return ready

    def load_progress(self, base_url: str) -> float | None:
        """:class:`backends.base.ReportsProgress`: what the last readiness answer said."""
        return self._progress.get(base_url)

    def load_message(self, base_url: str) -> str:
        """:class:`backends.base.ReportsStageMessage`: what the last readiness answer said."""
        return self._message.get(base_url, "")

    async def busy(self, base_url: str) -> bool:
        return False

    def queue_depth(self, base_url: str) -> int | None:
        """:class:`backends.base.ReportsQueue`: what the last busy poll read (``None`` for an
        engine that does not tell its queue)."""
        return self._queue.get(base_url)

    def heard_queue(self, base_url: str, depth: int | None) -> bool | None:
        """Keep the queue depth a busy poll read (``None``: no answer); busy is a queue that
        is not empty, ``None`` when there was no answer (see :meth:`busy_from`)."""
        if depth is None or depth < 0:
            self._queue.pop(base_url, None)
            return None
        self._queue[base_url] = depth
        return depth > 0

    async def busy_from(self, probe: Awaitable[bool | None]) -> bool:
        """A busy answer where ``None`` (no answer) repeats the last one: a render in progress
        is never given up because one poll of a loaded engine timed out."""
        answer = await probe
        if answer is None:
            return self._last_busy
        self._last_busy = answer
        return answer

    def may_start(self, facts: RequestFacts) -> bool:
        """Websockets never wake (an idle tab reconnects forever); ``wake_on: none`` nothing;
        nor a probe (:meth:`is_probe`) or one of the engine's reads (:meth:`is_read`), whatever
        the ``Accept``; page loads always; ``wake_on: navigation`` no other read; the rest: the
        engine's rule."""
        if facts.is_websocket or self.wake_on == "none":
            return False
        if self.is_probe(facts) or self.is_read(facts):
            return False
        if facts.is_navigation:
            return True
        if self.wake_on == "navigation" and facts.method in SAFE_METHODS:
            return False
        return self.request_wakes(facts)

    def is_probe(self, facts: RequestFacts) -> bool:
        """A health or readiness probe (``/readyz``, ``/healthz``, the ``readiness.path`` the
        config names): a monitor asking whether the engine is up must never start it. An
        engine's default readiness path is left out: it is also an API its clients open with
        (Gradio's ``/config``, which ``gradio_client`` reads first)."""
        if facts.method not in SAFE_METHODS:
            return False
        path = facts.path.split("?", 1)[0].rstrip("/") or "/"
        return path in PROBE_PATHS or (self._explicit_ready_path and path == self.ready_path)

    def is_read(self, facts: RequestFacts) -> bool:
        """One of the engine's API reads (ComfyUI's ``/object_info``, ``/api/queue``): answered
        as a probe is, never a start, even opened in a browser tab (``Accept: text/html``
        makes it look like a page load). None here: an engine's pages are its paths."""
        return False

    def request_wakes(self, facts: RequestFacts) -> bool:
        """The engine's own rule for a request that is neither a websocket nor a page load."""
        return True

    def stream_activity(self, path: str) -> StreamActivity:
        return "frames"

    # -- backends.base.Parkable ---------------------------------------------------------------

    def auto_park(self) -> ParkRequests | None:
        """The engine kind's own park action, for ``park: auto``; none here (gradio, http)."""
        return None

    @property
    def parks(self) -> bool:
        return self.parker is not None

    async def park(self, base_url: str) -> None:
        assert self.parker is not None, "park() on an engine that does not park"
        await self.parker.park(self.client(), base_url)

    async def wake(self, base_url: str) -> None:
        assert self.parker is not None, "wake() on an engine that does not park"
        await self.parker.wake(self.client(), base_url)

    async def is_parked(self, base_url: str) -> bool | None:
        return None if self.parker is None else await self.parker.is_parked(self.client(), base_url)

    async def close(self) -> None:
        if self.warmup is not None:
            await self.warmup.close()
        if self._session is not None:
            await self._session.close()
