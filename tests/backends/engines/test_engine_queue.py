"""Busy means the engine's own queue: the busy poll reads the depth of the engine's queue
(ComfyUI's ``queue_remaining`` from the demo engine, vLLM's ``vllm:num_requests_waiting`` from a
fake vLLM whose scheduler really makes requests wait, Gradio's ``queue_size`` from a real Gradio
app), warmgate learns the time one job takes there, and the API policy overflows to the cloud
while that queue is deep or its wait is over the request's latency budget (``local_busy``, the
depth in ``X-Warmgate-Decision``)."""

from __future__ import annotations

import asyncio
import math
import re
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from backends.engines.openai_compat import waiting_requests
from backends.outside import Refused
from router.openai.facts import Ask, CloudOption, LocalOption, Rules, Snapshot
from router.openai.policy import Action, decide
from router.scale.engine_queue import EngineQueue
from router.scale.state import Phase
from tests.backends.engines.test_gradio_queue import gradio529_python
from tests.fake_openai import FakeOpenAI
from tests.helpers import ROOT, gradio_app, metric_value, serve_app, wait_until, warmgate
from tests.openai_stack import CLOUD_KEY, KEY_ENV, PRICES
from tests.scale.test_parked import graph

# -- learning the time per job ------------------------------------------------------------------


def test_the_time_per_job_is_learned_from_the_queue_draining() -> None:
    queue = EngineQueue()
    assert (queue.depth, queue.job_seconds, queue.wait()) == (0, None, 0.0)
    queue.heard(3, 100.0)
    assert queue.wait() == 0.0, "nothing learned yet: no wait predicted"
    queue.heard(3, 102.0)
    queue.heard(2, 104.0)  # one job left after 4 s of work
    assert queue.job_seconds == 4.0
    queue.heard(0, 110.0)  # two more in 6 s
    assert list(queue.samples) == [4.0, 3.0]
    queue.heard(0, 200.0)  # idle time is not work
    queue.heard(1, 201.0)
    queue.heard(0, 203.0)
    assert list(queue.samples) == [4.0, 3.0, 2.0]
    assert queue.job_seconds == 3.0
    queue.heard(5, 204.0)
    assert (queue.depth, queue.wait()) == (5, 15.0)


def test_nothing_is_learned_across_a_gap_and_a_restart_empties_the_queue() -> None:
    queue = EngineQueue()
    queue.heard(2, 0.0)
    queue.heard(None, 2.0)  # the poll got no answer
    queue.heard(1, 60.0)  # a minute later: not a minute per job
    assert queue.job_seconds is None and queue.depth == 1
    queue.heard(0, 61.0)
    assert queue.job_seconds == 1.0
    queue.heard(4, 62.0)
    queue.restart()  # parked and woken, or stopped and started again
    assert (queue.depth, queue.wait(), queue.job_seconds) == (0, 0.0, 1.0)


def test_a_depth_out_of_bounds_is_no_answer_to_the_queue_and_to_the_vllm_reading() -> None:
    queue = EngineQueue()
    queue.heard(3, 0.0)
    queue.heard(10**400, 1.0)  # once: OverflowError in the time per job
    queue.heard(0, 2.0)
    assert (queue.depth, queue.job_seconds, queue.wait()) == (0, None, 0.0)
    for value in ("1e400", "NaN", "-Inf", "-3"):
        with pytest.raises(Refused, match="requests_waiting"):
            waiting_requests(f"vllm:num_requests_waiting {value}\n")


def test_vllm_metrics_give_the_requests_waiting() -> None:
    text = (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="qwen"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="qwen"} 2.0 1712000000000\n'
        'vllm:num_requests_waiting_by_reason{reason="x"} 9.0\n'
        'vllm:num_requests_running{engine="0",model_name="qwen"} 8.0\n'
    )
    assert waiting_requests(text) == 5
    assert waiting_requests("tgi_queue_size 4\n") == 4
    assert waiting_requests('llamacpp:requests_deferred{a="b"} 1\n') == 1
    assert waiting_requests("process_cpu_seconds_total 1.5\n") is None


# -- the policy ---------------------------------------------------------------------------------

CLOUD = CloudOption(position=1, cloud="managed", model="image-large", available=True, cost=0.04)
RULES = Rules(overflow_queue_depth=4)


def ready(queue: int = 0, wait: float = 0.0, load: int | None = None) -> LocalOption:
    return LocalOption(
        0,
        "comfyui",
        Phase.READY,
        0.0,
        True,
        load=queue if load is None else load,
        queue=queue,
        queue_wait=wait,
    )


def decided(option: LocalOption, max_wait: float = 10.0, private: bool = False) -> Any:
    snap = Snapshot((option,), (CLOUD,), budget_left=5.0, now=0.0)
    return decide(Ask(private=private, max_wait=max_wait), snap, RULES)


def test_a_deep_engine_queue_overflows_to_the_cloud_with_its_depth() -> None:
    decision = decided(ready(queue=7))
    assert decision.action is Action.CLOUD
    assert decision.header == "managed/image-large; reason=local_busy; queue_depth=7"
    assert "7" in decision.detail


def test_the_wait_in_the_queue_counts_against_the_latency_budget() -> None:
    within = decided(ready(queue=2, wait=8.0), max_wait=10.0)
    assert (within.action, within.reason) == (Action.LOCAL, "ready")
    late = decided(ready(queue=2, wait=24.0), max_wait=10.0)
    assert (late.action, late.header) == (
        Action.CLOUD,
        "managed/image-large; reason=local_busy; queue_depth=2",
    )
    assert "24s" in late.detail and "10s" in late.detail


def test_a_busy_queue_keeps_private_work_local() -> None:
    decision = decided(ready(queue=9, wait=90.0), private=True)
    assert (decision.action, decision.reason) == (Action.LOCAL, "busy_private")
    assert decision.header == "comfyui; reason=busy_private"


def test_warmgates_own_requests_count_where_they_are_more() -> None:
    decision = decided(ready(queue=1, load=6))
    assert decision.header == "managed/image-large; reason=local_busy; queue_depth=6"
    assert math.isclose(ready(queue=1).ready_in(0.0), 0.0)


# -- with real engines --------------------------------------------------------------------------

WORKFLOW = "deploy/local/workflows/flux_dev.json"
IMAGES = {"per_image": 0.04}


def demo_target(tmp: Path) -> dict[str, Any]:
    """The demo engine (ComfyUI's API) rendering for 2 s a prompt, polled every 200 ms."""
    command = [
        sys.executable, "-m", "backends.demo_engine", "--port", "{port}",
        "--checkpoint-size", "1MiB", "--checkpoint", str(tmp / "ckpt.bin"),
        "--render-seconds", "2.0", "--steps", "2",
    ]  # fmt: skip
    return {
        "engine": "comfyui",
        "routes": [{"path_prefix": "/render", "strip_prefix": True}],
        "backend": {"kind": "process", "command": command, "cwd": str(ROOT), "stop_grace": "5s"},
        "readiness": {"path": "/readyz", "interval": "50ms"},
        "scaling": {"idle_after": "10m", "cold_start_timeout": "60s", "busy_poll": "200ms"},
    }


def api_config(targets: dict[str, Any], cloud_url: str, models: dict[str, Any]) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": targets,
        "models": models,
        "clouds": {"managed": {"base_url": cloud_url + "/v1", "api_key_env": KEY_ENV}},
        "policy": {"daily_cloud_budget_usd": 5, "max_wait": "10m", "overflow_queue_depth": 2},
        "api": {"allow_anonymous": True},
    }


async def queue_renders(client: aiohttp.ClientSession, url: str, count: int) -> list[str]:
    """Renders queued the way a person's tab queues them (``POST /prompt``), through warmgate."""
    ids = []
    for i in range(count):
        async with client.post(url + "/prompt", json={"prompt": graph(f"fox {i}")}) as resp:
            assert resp.status == 200, await resp.text()
            ids.append((await resp.json())["prompt_id"])
    return ids


def depth_in(header: str) -> int:
    found = re.search(r"queue_depth=(\d+)", header)
    assert found is not None, header
    return int(found.group(1))


async def test_api_images_overflow_while_the_ui_users_renders_fill_comfyuis_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, CLOUD_KEY)
    cloud = FakeOpenAI(api_key=CLOUD_KEY, name="cloud")
    models = {
        "flux-dev": {
            "kind": "images",
            "placements": [
                {"target": "render", "workflow": str(ROOT / WORKFLOW)},
                {"cloud": "managed", "model": "image-large", "cost": IMAGES},
            ],
        }
    }
    async with serve_app(cloud.app()) as cloud_url:
        data = api_config({"render": demo_target(tmp_path)}, cloud_url, models)
        async with warmgate(data) as wg, aiohttp.ClientSession() as client:
            render = wg.runtime("render")
            api = openai.AsyncOpenAI(base_url=wg.url + "/v1", api_key="unused", max_retries=0)

            async def image(max_wait: str) -> str:
                raw = await api.images.with_raw_response.generate(
                    model="flux-dev",
                    prompt="a gate",
                    size="64x64",
                    extra_headers={"X-Warmgate-Max-Wait": max_wait},
                )
                return raw.headers["x-warmgate-decision"]

            # One render through the UI: the target starts, and the poll sees the queue drain.
            await queue_renders(client, wg.url + "/render", 1)
            await wait_until(lambda: render.queue.job_seconds is not None, timeout=60)
            await wait_until(lambda: render.queue.depth == 0, timeout=30)
            assert await image("10m") == "render; reason=ready"

            # Two renders queued by the UI (within overflow_queue_depth): their wait (2 jobs x
            # about 2 s) is over a 500 ms budget, within a minute's.
            await queue_renders(client, wg.url + "/render", 2)
            await wait_until(lambda: render.queue.depth >= 1, timeout=10)
            late = await image("500ms")
            assert late.startswith("managed/image-large; reason=local_busy; queue_depth=")
            assert depth_in(late) >= 1
            assert cloud.count("/v1/images/generations") == 1

            # More queued than overflow_queue_depth: the cloud whatever the budget.
            await queue_renders(client, wg.url + "/render", 3)
            await wait_until(lambda: render.queue.depth > 2, timeout=10)
            deep = await image("10m")
            assert deep.startswith("managed/image-large; reason=local_busy; queue_depth=")
            assert depth_in(deep) > 2
            assert cloud.count("/v1/images/generations") == 2
            assert (
                await metric_value(wg.admin, "warmgate_decisions_total", reason="local_busy") == 2
            )
            assert render.activity.in_flight == 0, "warmgate itself had nothing in flight"
            async with client.get(wg.admin + "/targets") as resp:
                shown = (await resp.json())["render"]
            assert shown["queue_depth"] >= 0 and shown["job_seconds"] > 0
            await api.close()


async def test_api_chat_overflows_while_vllm_has_requests_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, CLOUD_KEY)
    cloud = FakeOpenAI(api_key=CLOUD_KEY, name="cloud")
    vllm = {
        "engine": "openai",
        "routes": [{"path_prefix": "/llm"}],
        "backend": {
            "kind": "process",
            "command": [
                sys.executable, "-m", "tests.fake_vllm", "--port", "{port}",
                "--max-num-seqs", "1", "--seconds-per-request", "5",
            ],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"interval": "50ms"},
        "scaling": {"idle_after": "10m", "cold_start_timeout": "30s", "busy_poll": "200ms"},
    }  # fmt: skip
    models = {
        "qwen3-8b": {
            "placements": [
                {"target": "qwen"},
                {"cloud": "managed", "model": "frontier-large", "cost": PRICES},
            ]
        }
    }
    body = {"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}]}
    async with serve_app(cloud.app()) as cloud_url:
        data = api_config({"qwen": vllm}, cloud_url, models)
        data["policy"]["overflow_queue_depth"] = 1
        async with warmgate(data) as wg, aiohttp.ClientSession() as client:
            qwen = wg.runtime("qwen")
            qwen.request_start()
            await wait_until(lambda: qwen.state.phase is Phase.READY, timeout=30)
            endpoint = qwen.state.endpoints[0]
            # Four clients of the server itself, not through warmgate: one runs, three wait.
            others = [
                asyncio.ensure_future(client.post(endpoint + "/v1/chat/completions", json=body))
                for _ in range(4)
            ]
            await wait_until(lambda: qwen.queue.depth == 3, timeout=10)
            assert qwen.activity.in_flight == 0
            api = openai.AsyncOpenAI(base_url=wg.url + "/v1", api_key="unused", max_retries=0)
            raw = await api.chat.completions.with_raw_response.create(
                model="qwen3-8b", messages=[{"role": "user", "content": "hello"}]
            )
            await api.close()
            decision = raw.headers["x-warmgate-decision"]
            assert decision.startswith("managed/frontier-large; reason=local_busy; queue_depth=")
            assert depth_in(decision) >= 2, "the three waiting, or two once the first ran"
            assert cloud.count("/v1/chat/completions") == 1
            for response in await asyncio.gather(*others):
                response.release()


@pytest.fixture(params=["5.29", "current"])
def gradio_python(request: pytest.FixtureRequest) -> str:
    return gradio529_python() if request.param == "5.29" else sys.executable


async def test_gradios_queue_size_is_the_depth_the_poll_reads(
    tmp_path: Path, gradio_python: str
) -> None:
    """Gradio 5 tells its queue at ``{api}/queue/status``: ``queue_size``, the jobs waiting for
    a worker (those running are not in it). The test app runs 4 jobs at once."""
    target = {
        "engine": "gradio",
        "routes": [{"path_prefix": "/wan", "strip_prefix": True}],
        "backend": gradio_app(tmp_path, gradio_python),
        "readiness": {"interval": "100ms"},
        "scaling": {"idle_after": "10m", "cold_start_timeout": "90s", "busy_poll": "200ms"},
        "waiting_page": "off",
    }
    data = {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {"wan": target},
    }
    async with warmgate(data, str(tmp_path)) as wg, aiohttp.ClientSession() as http:
        wan = wg.runtime("wan")
        async with http.get(f"{wg.url}/wan/config", timeout=120) as response:
            app = await response.json()
        api = f"{wg.url}/wan{app['api_prefix']}"
        fn = {d.get("api_name"): d["id"] for d in app["dependencies"]}
        for i in range(6):
            body = {
                "data": [f"cat {i}", 20.0, None],
                "fn_index": fn["generate"],
                "session_hash": f"s{i}",
                "event_data": None,
                "trigger_id": None,
            }
            async with http.post(f"{api}/queue/join", json=body) as response:
                assert response.status == 200, await response.text()
        await wait_until(lambda: wan.queue.depth == 2, timeout=30)
        assert wan.activity.busy_until > wan.loop.time(), "a queue that is not empty is busy"


QUEUE_FIELDS = {"gradio": "queue_size", "comfyui": "queue_remaining"}
HOSTILE_QUEUE = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

answers = [10**400, 0, float("nan"), True, 2]  # then 2 for good


class Engine(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path in ("/gradio_api/queue/status", "/prompt"):
            depth = answers.pop(0) if len(answers) > 1 else answers[0]
            said = {"queue_size": depth, "exec_info": {"queue_remaining": depth}}
        else:
            said = {}
        body = json.dumps(said).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(sys.argv[1])), Engine).serve_forever()
"""


@pytest.mark.parametrize("engine", ["gradio", "comfyui"])
async def test_an_engine_queue_beyond_the_float_range_is_no_answer_and_the_poll_goes_on(
    engine: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A queue of 401 digits (valid JSON) once raised OverflowError in the queue's bookkeeping
    and ended the target's lifecycle: now it is no answer, counted, logged once."""
    script = tmp_path / "hostile_queue.py"
    script.write_text(HOSTILE_QUEUE)
    target = {
        "engine": engine,
        "routes": [{}],
        "backend": {"kind": "process", "command": [sys.executable, str(script), "{port}"]},
        "readiness": {"path": "/ready", "interval": "50ms"},
        "scaling": {"busy_poll": "50ms", "idle_after": "10m", "cold_start_timeout": "30s"},
        "waiting_page": "off",
    }
    data = {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "targets": {"t": target}}
    async with warmgate(data, str(tmp_path)) as wg, aiohttp.ClientSession() as http:
        async with http.get(wg.url + "/go") as response:
            assert response.status == 200, await response.text()  # started, then polled
        runtime = wg.runtime("t")
        await wait_until(lambda: runtime.queue.depth == 2, timeout=30)
        refused = {"source": "engine", "field": QUEUE_FIELDS[engine]}
        assert await metric_value(wg.admin, "warmgate_outside_refused_total", **refused) == 3
        logged = [r for r in caplog.records if f"{QUEUE_FIELDS[engine]}=" in r.getMessage()]
        assert len(logged) == 1, [r.getMessage() for r in logged]  # once, not at every poll
        assert runtime.state.phase is Phase.READY
