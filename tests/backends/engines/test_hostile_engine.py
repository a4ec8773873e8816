"""A hostile engine, fuzzed (``make fuzz``: 10,000 examples each; ``make test``: 200).

1. Over the wire: a real server on 127.0.0.1 answers each engine's readiness, queue and load
   paths with random status codes and bodies (random JSON of every shape, integers beyond the
   float range, NaN and infinities as Python's json writes them, lone surrogates, control
   characters, raw bytes). Each engine's probe, progress, busy poll and queue depth, and the
   router's bookkeeping of that depth, never raise (but ``StartFailed``, whose reason is then one
   bounded line), and every number they pass on is in its bounds.
2. Through the lifecycle: a target whose engine answers at random (ready or not, a failure in
   random words, an unexpected exception, a random queue depth) on a virtual clock: its loop
   never ends, its status JSON parses, its waiting page is 200/503 HTML with the words escaped,
   and once the engine is quiet the idle target is released.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from backends.base import StartFailed, load_progress
from backends.outside import ERROR_CHARS
from backends.registry import make_engine
from backends.specs import EngineSpec
from router.config import parse_config
from router.metrics import Metrics
from router.routing.waiting import render, status
from router.scale.engine_queue import EngineQueue
from router.scale.lifecycle import Lifecycle
from router.scale.state import Phase
from router.scale.targets import TargetRuntime
from router.simulate.clock import VirtualLoop
from tests.fakes import FakeBackend, FakeEngine
from tests.fuzzing import FUZZ, examples
from tests.helpers import free_port

EXAMPLES = 10_000 if FUZZ else 200
SETTINGS = examples(200, 10_000)
RAN: dict[str, int] = {}
"""Examples run, by property (printed at the end of each test)."""

HUGE = st.sampled_from([10**400, -(10**400), 2**63, -1, 0, 1, 7, 1e308, 0.5, -0.5])
WORDS = st.text(
    alphabet=st.characters(codec=None, categories=None), max_size=400
) | st.sampled_from(["\ud800", "a\r\nb", "\x1b[2J\x00", "x" * 5000, "<script>alert(1)</script>"])
SCALARS = st.none() | st.booleans() | HUGE | st.integers() | st.floats() | WORDS
JSONISH = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            WORDS
            | st.sampled_from(
                [
                    "stage",
                    "error",
                    "progress",
                    "queue_size",
                    "exec_info",
                    "queue_remaining",
                    "detail",
                    "message",
                    "status",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=12,
)
SHAPED = st.fixed_dictionaries(  # the shapes engines really answer, with hostile values
    {},
    optional={
        "stage": st.sampled_from(["failed", "loading", "ready"]) | WORDS,
        "error": JSONISH,
        "progress": SCALARS,
        "queue_size": SCALARS,
        "exec_info": st.fixed_dictionaries({}, optional={"queue_remaining": SCALARS}) | JSONISH,
    },
)


def _body(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


BODIES = (
    st.builds(_body, SHAPED | JSONISH)
    | st.binary(max_size=300)
    | st.sampled_from([b"", b"NaN", b"Infinity", b"-Infinity", b"1e400", b"9" * 401, b"{"])
)


@dataclass
class Answer:
    status: int
    body: bytes


ANSWERS = st.builds(
    Answer, st.sampled_from([200, 200, 200, 202, 204, 301, 400, 404, 500, 503]), BODIES
)


@dataclass
class Hostile:
    """A server whose every path answers what the current example says."""

    answers: dict[str, Answer] = field(default_factory=dict)
    default: Answer = field(default_factory=lambda: Answer(200, b"{}"))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        answer = self.answers.get(request.path, self.default)
        if answer.status == 204:
            return web.Response(status=204)
        return web.Response(status=answer.status, body=answer.body, content_type="application/json")


@dataclass
class Served:
    hostile: Hostile
    url: str
    loop: asyncio.AbstractEventLoop


def serve_hostile(test: Callable[[Served], None]) -> None:
    loop = asyncio.new_event_loop()
    hostile = Hostile()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hostile.handle)
    runner = web.AppRunner(app, access_log=None)
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    try:
        test(Served(hostile, f"http://127.0.0.1:{port}", loop))
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()


KNOWN = [
    Answer(200, b'{"queue_size": ' + b"9" * 401 + b', "exec_info": {"queue_remaining": 1e400}}'),
    Answer(200, b'{"queue_size": NaN, "exec_info": {"queue_remaining": -Infinity}}'),
    Answer(200, b'{"queue_size": true, "exec_info": {"queue_remaining": 2.5}}'),
    Answer(503, b'{"stage": "failed", "error": "a\\r\\nb\\u001b\\ud800' + b"x" * 200_000 + b'"}'),
    Answer(503, b'{"stage": "loading", "progress": 1e400}'),
]
"""Answers the held-out probes sent, asked of every engine before the random ones."""

ENGINE_PATHS = {
    "comfyui": ["/api/readyz", "/readyz", "/prompt", "/api/prompt", "/queue", "/system_stats"],
    "gradio": ["/config", "/gradio_api/queue/status", "/queue/status", "/readyz"],
    "openai": ["/v1/models", "/health", "/readyz", "/metrics"],
    "http": ["/", "/readyz"],
}


async def _poll(engine: Any, url: str, queue: EngineQueue, now: float) -> None:
    try:
        await engine.probe_ready(url)
    except StartFailed as exc:
        said = str(exc)
        assert len(said) <= ERROR_CHARS and said == said.strip()
        assert not any(c in said for c in "\r\n\x00\x1b"), said[:80]
        said.encode("utf-8")
    progress = load_progress(engine, url)
    assert progress is None or 0.0 <= progress <= 1.0
    assert isinstance(await engine.busy(url), bool)
    depth = engine.queue_depth(url) if hasattr(engine, "queue_depth") else None
    assert depth is None or (isinstance(depth, int) and 0 <= depth < 2**31)
    queue.heard(depth, now)  # the router's bookkeeping of it: never an exception
    json.dumps([queue.job_seconds, queue.wait()], allow_nan=False)  # what the API policy reads


@pytest.mark.parametrize("kind", sorted(ENGINE_PATHS))
def test_an_engines_random_answers_never_raise_and_numbers_stay_in_bounds(kind: str) -> None:
    spec = EngineSpec(kind=kind)

    def run(served: Served) -> None:
        engine = make_engine(spec)
        queue = EngineQueue()
        clock = [0.0]

        @SETTINGS
        @given(st.fixed_dictionaries({path: ANSWERS for path in ENGINE_PATHS[kind]}))
        def example(answers: dict[str, Answer]) -> None:
            served.hostile.answers = answers
            clock[0] += 1.0
            served.loop.run_until_complete(_poll(engine, served.url, queue, clock[0]))
            RAN[kind] = RAN.get(kind, 0) + 1

        try:
            for known in KNOWN:  # what the held-out probes sent, every run
                served.hostile.answers = dict.fromkeys(ENGINE_PATHS[kind], known)
                served.loop.run_until_complete(_poll(engine, served.url, queue, clock[0]))
            example()
        finally:
            served.loop.run_until_complete(engine.close())

    serve_hostile(run)
    print(f"hostile {kind} engine: {RAN.get(kind, 0)} examples")


# -- through the lifecycle ----------------------------------------------------------------------


class Unexpected(Exception):
    """What an engine adapter with a bug would raise."""


PROBES = st.sampled_from(["ready", "not", "failed", "raise"])
TURN = st.fixed_dictionaries(
    {"probe": PROBES, "words": WORDS, "busy": st.booleans() | st.just("raise"), "depth": SCALARS}
)


class HostileTwin(FakeEngine):
    """The fake engine twin, answering each call from the example's script, then quiet."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        super().__init__()
        self.script = script
        self.calls = 0
        self.depth: object = None

    def _next(self) -> dict[str, Any] | None:
        self.calls += 1
        return self.script[self.calls - 1] if self.calls <= len(self.script) else None

    async def probe_ready(self, base_url: str) -> bool:
        turn = self._next()
        if turn is None:
            return True
        if turn["probe"] == "failed":
            raise StartFailed(turn["words"])
        if turn["probe"] == "raise":
            raise Unexpected(turn["words"])
        return bool(turn["probe"] == "ready")

    async def busy(self, base_url: str) -> bool:
        turn = self._next()
        if turn is None:
            self.depth = 0
            return False
        self.depth = turn["depth"]
        if turn["busy"] == "raise":
            raise Unexpected(turn["words"])
        return bool(turn["busy"])

    def queue_depth(self, base_url: str) -> Any:
        return self.depth  # a buggy adapter passing on what the engine said as it is


async def _day(script: list[dict[str, Any]]) -> None:
    config = parse_config(
        {
            "targets": {
                "t": {
                    "routes": [{}],
                    "backend": {"kind": "process", "command": ["engine"]},
                    "scaling": {
                        "idle_after": "30s",
                        "cold_start_timeout": "60s",
                        "failure_backoff": "5s",
                        "busy_poll": "1s",
                    },
                }
            }
        }
    )
    loop = asyncio.get_running_loop()
    backend, engine, metrics = FakeBackend(), HostileTwin(script), Metrics()
    runtime = TargetRuntime("t", config.targets["t"], backend, engine, metrics, loop)
    lifecycle = Lifecycle(runtime)
    await lifecycle.open()
    try:
        for _ in range(3):  # a person comes three times; each may meet a failure
            runtime.request_start(waiting=True)
            await asyncio.sleep(20)
            _answers_parse(runtime)
        await asyncio.sleep(3600)  # quiet: the engine's script is over, nobody comes
        assert runtime.supervisor.running, "the lifecycle never ends"
        assert runtime.state.phase in (Phase.COLD, Phase.FAILED), runtime.state
        assert not backend.observe().running, "the idle GPU is given back"
        _answers_parse(runtime)
    finally:
        await lifecycle.close()


def _answers_parse(runtime: TargetRuntime) -> None:
    json.loads(json.dumps(status(runtime), allow_nan=False))
    page = render(runtime)
    assert page.status in (200, 503)
    text = page.text or ""
    assert "<script>alert" not in text
    text.encode("utf-8")


@SETTINGS
@given(st.lists(TURN, max_size=30))
def test_a_hostile_engine_never_ends_the_lifecycle_and_the_idle_target_is_released(
    script: list[dict[str, Any]],
) -> None:
    loop = VirtualLoop(start=1000.0)
    try:
        loop.run_until_complete(_day(script))
    finally:
        loop.close()
    RAN["lifecycle"] = RAN.get("lifecycle", 0) + 1
    if RAN["lifecycle"] % EXAMPLES == 0:
        print(f"hostile engine through the lifecycle: {RAN['lifecycle']} examples")
