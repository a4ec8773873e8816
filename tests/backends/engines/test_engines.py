"""The pure parts of the engines: wake rules, stream activity, readiness paths, the warm-up
runner, ComfyUI and Gradio message parsing, and the engine keys of the config file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from backends.base import (
    RequestFacts,
    StartFailed,
    json_answer,
    load_progress,
    websocket_again,
)
from backends.engines.comfyui import ComfyUIEngine, api_route, history_outcome, prompt_error
from backends.engines.common import Warmup, WarmupFailed, engine_error, failure_of
from backends.engines.gradio import GradioEngine, sse_events
from backends.engines.http import HttpEngine
from backends.engines.openai_compat import OpenAIEngine
from backends.registry import make_engine
from backends.specs import EngineSpec, Readiness
from router.config import parse_config
from router.errors import ConfigError
from tests.helpers import serve_app


def facts(method: str, path: str, *, ws: bool = False, nav: bool = False) -> RequestFacts:
    return RequestFacts(method=method, path=path, is_websocket=ws, is_navigation=nav)


COMFY = ComfyUIEngine(EngineSpec(kind="comfyui"))
GRADIO = GradioEngine(EngineSpec(kind="gradio"))
OPENAI = OpenAIEngine(EngineSpec(kind="openai"))


@pytest.mark.parametrize(
    ("request_facts", "wakes"),
    [
        (facts("GET", "/", nav=True), True),  # a page load
        (facts("POST", "/prompt"), True),
        (facts("POST", "/api/prompt"), True),
        (facts("POST", "/upload/image"), True),
        (facts("GET", "/assets/index-3f2a.js"), True),  # the page load's assets
        (facts("GET", "/extensions/my-node/widget.js"), True),
        (facts("GET", "/ws", ws=True), False),  # the idle tab reconnecting
        (facts("GET", "/api/ws", ws=True), False),
        (facts("GET", "/queue"), False),  # background polling
        (facts("GET", "/api/history"), False),
        (facts("GET", "/history/abc"), False),
        (facts("GET", "/system_stats"), False),
        (facts("GET", "/prompt"), False),
        (facts("GET", "/object_info"), False),
        (facts("GET", "/extensions"), False),
        (facts("GET", "/view", nav=False), False),
        (facts("POST", "/interrupt"), False),
        (facts("POST", "/api/userdata/workflows%2Fa.json"), False),
    ],
)
def test_comfyui_wake_rules(request_facts: RequestFacts, wakes: bool) -> None:
    assert COMFY.may_start(request_facts) is wakes


def test_comfyui_api_routes_and_streams() -> None:
    assert api_route("/api/prompt") == "prompt" and api_route("/prompt") == "prompt"
    assert api_route("/api") == "" and api_route("/") is None
    assert api_route("/extensions/x/y.js") is None and api_route("/extensions") == "extensions"
    assert COMFY.stream_activity("/ws") == "none" and COMFY.stream_activity("/api/ws") == "none"
    assert COMFY.stream_activity("/other/stream") == "frames"


def test_wake_on_narrows_every_engine() -> None:
    narrow = ComfyUIEngine(EngineSpec(kind="comfyui", wake_on="navigation"))
    assert narrow.may_start(facts("GET", "/", nav=True))
    assert narrow.may_start(facts("POST", "/prompt"))
    assert not narrow.may_start(facts("GET", "/assets/a.js"))
    off = GradioEngine(EngineSpec(kind="gradio", wake_on="none"))
    assert not off.may_start(facts("GET", "/", nav=True))
    http = HttpEngine(EngineSpec(wake_on="navigation"))
    assert http.may_start(facts("POST", "/x")) and not http.may_start(facts("GET", "/x"))
    assert HttpEngine(EngineSpec()).may_start(facts("GET", "/x"))
    assert not HttpEngine(EngineSpec()).may_start(facts("GET", "/x", ws=True))


@pytest.mark.parametrize(
    ("path", "activity", "wakes"),
    [
        ("/gradio_api/queue/data", "jobs", False),
        ("/gradio_api/call/generate/ev1", "open", True),
        ("/gradio_api/heartbeat/abc", "none", False),
        ("/gradio_api/upload_progress", "frames", True),
        ("/config", "frames", True),
        ("/queue/data", "jobs", False),  # Gradio 4, no api prefix
    ],
)
def test_gradio_streams_and_wakes(path: str, activity: str, wakes: bool) -> None:
    assert GRADIO.stream_activity(path) == activity
    assert GRADIO.may_start(facts("GET", path)) is wakes


def test_openai_wakes_on_work_only_and_streams_are_in_flight() -> None:
    assert OPENAI.may_start(facts("POST", "/v1/chat/completions"))
    assert not OPENAI.may_start(facts("GET", "/v1/models"))
    assert not OPENAI.may_start(facts("GET", "/health"))
    assert OPENAI.stream_activity("/v1/chat/completions") == "open"


def test_a_probe_through_warmgate_never_wakes() -> None:
    """A monitor asking whether the engine is up (``/readyz``, ``/healthz``, the readiness path
    the config names) must not start its GPU; the unknown first segment no longer reads as a
    frontend file. An engine's default readiness path that is also its clients' first call
    (Gradio's ``/config``) still wakes."""
    own = Readiness.model_validate({"path": "/ping"})
    engines = [COMFY, GRADIO, OPENAI, HttpEngine(EngineSpec())]
    engines += [make_engine(EngineSpec(kind=kind, readiness=own)) for kind in ("comfyui", "http")]  # type: ignore[arg-type]
    for engine in engines:
        for path in ("/readyz", "/healthz", "/readyz/", "/healthz?verbose=1"):
            for nav in (False, True):
                assert not engine.may_start(facts("GET", path, nav=nav)), (engine, path, nav)
        assert not engine.may_start(facts("HEAD", "/readyz")), engine
    for engine in engines[-2:]:
        assert not engine.may_start(facts("GET", "/ping")), "the config's own readiness path"
    assert COMFY.may_start(facts("GET", "/ping"))  # a frontend file, as before
    assert GRADIO.may_start(facts("GET", "/config")), "gradio_client opens with it"
    assert COMFY.may_start(facts("GET", "/", nav=True))
    assert COMFY.may_start(facts("POST", "/prompt"))


def test_readiness_paths_default_per_engine_unless_set() -> None:
    assert COMFY.ready_path == "/system_stats"
    assert GRADIO.ready_path == "/config"
    assert OPENAI.ready_path == "/v1/models"
    assert HttpEngine(EngineSpec()).ready_path == "/readyz"
    explicit = Readiness.model_validate({"path": "/readyz"})
    assert ComfyUIEngine(EngineSpec(kind="comfyui", readiness=explicit)).ready_path == "/readyz"
    for kind, cls in (("http", HttpEngine), ("comfyui", ComfyUIEngine), ("gradio", GradioEngine)):
        assert type(make_engine(EngineSpec(kind=kind))) is cls  # type: ignore[arg-type]


def test_sse_events_are_split_on_blank_lines() -> None:
    events, rest = sse_events(
        'event: generating\ndata: ["a"]\n\nevent: heartbeat\ndata: null\n\nevent: com'
    )
    assert events == [("generating", '["a"]'), ("heartbeat", "null")]
    assert rest == "event: com"
    events, rest = sse_events(rest + 'plete\r\ndata: ["b"]\r\n\r\n')
    assert events == [("complete", '["b"]')] and rest == ""


def test_comfyui_history_and_prompt_errors() -> None:
    assert history_outcome(None) is None
    assert history_outcome({"status": {"status_str": "success", "completed": True}}) == "success"
    failed = {
        "status": {
            "status_str": "error",
            "completed": False,
            "messages": [
                ["execution_start", {}],
                ["execution_error", {"exception_message": "OOM", "node_type": "KSampler"}],
            ],
        }
    }
    assert history_outcome(failed) == "OOM (node KSampler)"
    body = {"error": {"message": "Prompt outputs failed validation"}, "node_errors": {"3": {}}}
    assert prompt_error(body, 400).startswith("Prompt outputs failed validation")
    assert prompt_error(None, 500) == "POST /prompt answered 500"


async def test_warmup_runs_once_per_start_and_reports_failures() -> None:
    runs: list[str] = []
    outcome: dict[str, Any] = {"error": None}
    gate = asyncio.Event()

    async def run(url: str) -> None:
        runs.append(url)
        await gate.wait()
        if outcome["error"] is not None:
            raise outcome["error"]

    warmup = Warmup("t", run)
    assert not warmup.done("http://a")  # started
    await asyncio.sleep(0)
    assert not warmup.done("http://a") and runs == ["http://a"]  # still running
    gate.set()
    await asyncio.sleep(0)
    assert warmup.done("http://a")
    assert not warmup.done("http://a") and len(runs) == 1  # the next start warms up again
    await asyncio.sleep(0)
    assert warmup.done("http://a") and len(runs) == 2

    outcome["error"] = ConnectionResetError("engine went away")
    assert not warmup.done("http://a")
    await asyncio.sleep(0)
    assert not warmup.done("http://a")  # interrupted: tried again on the next probe
    outcome["error"] = WarmupFailed("bad workflow")
    assert not warmup.done("http://a")
    await asyncio.sleep(0)
    with pytest.raises(WarmupFailed, match="t warm-up failed: bad workflow"):
        warmup.done("http://a")

    gate.clear()
    assert not warmup.done("http://b")
    assert not warmup.done("http://c")  # http://b belonged to an earlier start: cancelled
    await warmup.close()


# -- the config file's engine keys ------------------------------------------------------------


def config(target: dict[str, Any], base_dir: Path) -> Any:
    spec = {"routes": [{"path_prefix": "/x", "strip_prefix": True}], **target}
    spec.setdefault("backend", {"kind": "process", "command": ["python", "-m", "app"]})
    return parse_config({"targets": {"t": spec}}, "<test>", str(base_dir))


def problems(target: dict[str, Any], base_dir: Path) -> str:
    with pytest.raises(ConfigError) as error:
        config(target, base_dir)
    return str(error.value)


def test_engine_keys_belong_to_their_engine(tmp_path: Path) -> None:
    message = problems({"engine": "gradio", "warmup_workflow": "w.json"}, tmp_path)
    assert "targets.t.warmup_workflow" in message and "engine: comfyui" in message
    message = problems({"engine": "comfyui", "warmup": {"api_name": "/go"}}, tmp_path)
    assert "targets.t.warmup" in message and "engine: gradio" in message
    assert "targets.t.engine" in problems({"engine": "vllm"}, tmp_path)
    assert "api_name" in problems({"engine": "gradio", "warmup": {"api_name": "a b"}}, tmp_path)


def test_the_warmup_workflow_is_checked_and_resolved(tmp_path: Path) -> None:
    message = problems({"engine": "comfyui", "warmup_workflow": "missing.json"}, tmp_path)
    assert "targets.t.warmup_workflow" in message and "cannot be read" in message
    (tmp_path / "ui.json").write_text(json.dumps({"nodes": [], "links": []}))
    assert "API Format" in problems({"engine": "comfyui", "warmup_workflow": "ui.json"}, tmp_path)
    graph = {"3": {"class_type": "KSampler", "inputs": {}}}
    (tmp_path / "w.json").write_text(json.dumps(graph))
    target = config({"engine": "comfyui", "warmup_workflow": "w.json"}, tmp_path).targets["t"]
    spec = target.engine_spec(str(tmp_path))
    assert spec.warmup_workflow == str((tmp_path / "w.json").resolve())
    assert ComfyUIEngine(spec).workflow == graph


def test_a_gradio_child_behind_a_prefix_gets_its_root_path(tmp_path: Path) -> None:
    target = config({"engine": "gradio"}, tmp_path).targets["t"]
    assert target.backend.env["GRADIO_ROOT_PATH"] == "/x"
    own = {"kind": "process", "command": ["python", "app.py"], "env": {"GRADIO_ROOT_PATH": "/y"}}
    target = config({"engine": "gradio", "backend": own}, tmp_path).targets["t"]
    assert target.backend.env["GRADIO_ROOT_PATH"] == "/y"
    at_root = {"engine": "gradio", "routes": [{"path_prefix": "/"}]}
    assert "GRADIO_ROOT_PATH" not in config(at_root, tmp_path).targets["t"].backend.env
    assert "GRADIO_ROOT_PATH" not in config({}, tmp_path).targets["t"].backend.env
    warm = config({"engine": "gradio", "warmup": {"api_name": "/load", "data": [1, "a"]}}, tmp_path)
    assert warm.targets["t"].warmup.api_name == "load"
    assert warm.targets["t"].warmup.data == (1, "a")


def test_a_comfyui_socket_connects_again_under_the_client_id_it_was_given() -> None:
    status = json.dumps({"type": "status", "data": {"status": {}, "sid": "abc123"}})
    assert websocket_again(COMFY, "/ws", status) == "/ws?clientId=abc123"
    assert websocket_again(COMFY, "/ws?lang=en", status) == "/ws?lang=en&clientId=abc123"
    assert websocket_again(COMFY, "/ws?clientId=mine", status) == "/ws?clientId=mine"
    assert websocket_again(COMFY, "/ws", '{"type": "executing", "data": {}}') == "/ws"
    assert websocket_again(COMFY, "/ws", "not json") == "/ws"
    assert websocket_again(COMFY, "/ws", None) == "/ws"
    http = HttpEngine(EngineSpec(kind="http"))
    assert websocket_again(http, "/ws", status) == "/ws"  # names no clients


# -- a readiness answer that says the start failed ------------------------------------------------


def test_a_readiness_body_that_says_failed_carries_the_reason() -> None:
    said = b'{"stage": "failed", "error": "Exception: Unable to locate file \'a.safetensors\'"}'
    assert failure_of(said) == "Exception: Unable to locate file 'a.safetensors'"
    assert failure_of(b'{"stage": "failed"}') == "its readiness answer says failed"
    for body in (b'{"stage": "loading", "progress": 0.4}', b"oops", b'["failed"]', b""):
        assert failure_of(body) is None


async def test_a_readyz_that_says_failed_fails_the_probe_with_the_engines_reason() -> None:
    answer: dict[str, Any] = {"stage": "loading", "progress": 0.5}

    async def readyz(request: web.Request) -> web.Response:
        return web.json_response(answer, status=503)

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    engine = make_engine(EngineSpec(kind="gradio", readiness=Readiness(path="/readyz")))
    async with serve_app(app) as url:
        assert await engine.probe_ready(url) is False
        assert load_progress(engine, url) == 0.5, "loading: a probe like any other"
        answer.update(stage="failed", error="wgp.py exited with code 1 (loading): Exception: x")
        with pytest.raises(StartFailed) as failed:
            await engine.probe_ready(url)
        assert str(failed.value) == "wgp.py exited with code 1 (loading): Exception: x"
    await engine.close()
    assert issubclass(WarmupFailed, StartFailed), "a failed warm-up is a failed start too"


async def test_readiness_port_probes_another_port_of_the_same_host() -> None:
    async def readyz(request: web.Request) -> web.Response:
        return web.json_response({"stage": "ready"})

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    async with serve_app(app) as ready:
        port = int(ready.rsplit(":", 1)[1])
        spec = EngineSpec(kind="comfyui", readiness=Readiness(path="/readyz", port=port))
        engine = make_engine(spec)
        # the engine's own port (9: nothing listens) is where traffic goes, not the probe
        assert await engine.probe_ready("http://127.0.0.1:9") is True
        await engine.close()


def test_ready_port_is_for_a_process_command_that_passes_it(tmp_path: Path) -> None:
    readiness = {"path": "/readyz", "port": "{ready_port}"}
    static = {"backend": {"kind": "static", "url": "http://127.0.0.1:1"}, "readiness": readiness}
    assert 'readiness.port "{ready_port}" needs a process backend' in problems(static, tmp_path)
    untold = {"readiness": readiness}  # python -m app: no {ready_port} in it
    assert "passes {ready_port}" in problems(untold, tmp_path)
    command = ["python", "-m", "launcher", "--ready-port", "{ready_port}", "--", "app"]
    told = config(
        {"readiness": readiness, "backend": {"kind": "process", "command": command}}, tmp_path
    )
    assert told.targets["t"].readiness.port == "{ready_port}"
    assert config({"readiness": {"port": 7861}}, tmp_path).targets["t"].readiness.port == 7861
    assert "readiness.port" in problems({"readiness": {"port": 70000}}, tmp_path)


def test_an_engines_error_keeps_its_meaningful_line() -> None:
    traceback = "Traceback (most recent call last):\n" + '  File "a.py", line 1\n' * 40
    traceback += "gradio.route_utils.FnIndexInferError: Could not infer function index\n"
    assert engine_error(traceback) == (
        "gradio.route_utils.FnIndexInferError: Could not infer function index"
    )
    assert engine_error('{"detail": "Not Found"}') == "Not Found"
    assert engine_error('"Out of memory"') == "Out of memory"
    assert engine_error("plain words\nthe last ones") == "the last ones"
    assert engine_error("") == "(no body)"
    assert len(engine_error("x" * 1000)) == 300


@pytest.mark.parametrize(
    ("method", "path", "json"),
    [
        ("GET", "/config", True),
        ("GET", "/gradio_api/info", True),
        ("POST", "/gradio_api/queue/join", True),
        ("POST", "/gradio_api/upload", True),
        ("POST", "/gradio_api/call/generate", True),
        ("GET", "/gradio_api/call/generate/abc", False),  # the job's stream
        ("POST", "/gradio_api/call/", False),
        ("GET", "/gradio_api/queue/data", False),
        ("GET", "/gradio_api/heartbeat/s", False),
        ("GET", "/", False),
        ("POST", "/config", False),
    ],
)
def test_gradio_names_what_it_answers_with_json(method: str, path: str, json: bool) -> None:
    assert json_answer(GRADIO, method, path) is json
    assert not json_answer(COMFY, method, path)
