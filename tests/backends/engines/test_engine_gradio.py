"""engine: gradio, end to end: a real Gradio app (tests/gradio_app.py) run by the process backend
behind warmgate at /wan, driven by the real gradio_client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gradio_client import Client

from router.scale.state import Phase
from tests.helpers import Running, gradio_app, metric_value, one_target, wait_until, warmgate

PREFIX = "/wan"


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")


def gradio_config(tmp_path: Path, **target: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "engine": "gradio",
        "routes": [{"path_prefix": PREFIX, "strip_prefix": True}],
        # GRADIO_IS_E2E_TEST: heartbeats every 250 ms instead of 15 s
        "backend": gradio_app(tmp_path, GRADIO_IS_E2E_TEST="1"),
        "readiness": {"interval": "100ms"},
        "scaling": {
            "idle_after": "2s",
            "busy_poll": "1s",
            "stream_activity_window": "500ms",
            "cold_start_timeout": "60s",
        },
        "waiting_page": "off",
    }
    return one_target("wan", spec, **target)


def phase(wg: Running) -> Phase:
    return wg.runtime("wan").state.phase  # type: ignore[no-any-return]


def client(url: str) -> Client:
    # The first request (GET /config) is held through the cold start: allow for it.
    return Client(url, download_files=False, verbose=False, httpx_kwargs={"timeout": 60})


async def test_gradio_client_is_served_through_a_cold_start_with_public_file_urls(
    tmp_path: Path,
) -> None:
    config = gradio_config(tmp_path, warmup={"api_name": "/warm_up", "data": []})
    async with warmgate(config, str(tmp_path)) as wg:
        public = wg.url + PREFIX + "/"
        assert phase(wg) is Phase.COLD

        def use() -> tuple[Any, ...]:
            app = client(public)
            try:
                return (
                    app.predict("cat", 0.1, api_name="/generate"),
                    app.predict("dog", 0.1, api_name="/generate"),
                    app.predict("cat", api_name="/export"),
                    app.predict(api_name="/events"),
                )
            finally:
                app.close()

        first, second, file, events = await asyncio.to_thread(use)
        assert first == "rendered cat (#1 in this session)"
        assert second == "rendered dog (#2 in this session)"  # gr.State kept per session
        # The warm-up call loaded the model before the first user call was forwarded.
        assert events.split(",")[:3] == ["warmup", "load", "generate"]
        assert file["url"].startswith(public + "gradio_api/file="), file["url"]
        async with aiohttp.ClientSession() as http, http.get(file["url"]) as r:
            assert r.status == 200 and await r.text() == "a render of cat\n"


async def test_a_long_job_keeps_the_target_and_a_heartbeat_alone_does_not(tmp_path: Path) -> None:
    async with warmgate(gradio_config(tmp_path), str(tmp_path)) as wg:
        public = wg.url + PREFIX + "/"

        def job() -> Any:
            app = client(public)
            try:
                return app.predict("cat", 4.0, api_name="/generate")
            finally:
                app.close()

        running = asyncio.ensure_future(asyncio.to_thread(job))
        await wait_until(lambda: phase(wg) is Phase.READY, timeout=40)
        while not running.done():
            # The job's event stream is silent for 4 s (idle_after is 2 s), with no other traffic.
            assert phase(wg) is Phase.READY, "released while a job was running"
            await asyncio.sleep(0.05)
        assert await running == "rendered cat (#1 in this session)"

        # A tab that only keeps its heartbeat open (a frame every 250 ms here) is idle.
        url = f"{wg.url}{PREFIX}/gradio_api/heartbeat/{uuid.uuid4().hex}"
        frames = 0
        opened = time.monotonic()
        async with aiohttp.ClientSession() as http, http.get(url) as r, asyncio.timeout(10):
            assert r.status == 200
            with contextlib.suppress(aiohttp.ClientPayloadError):  # cut at the release
                async for _ in r.content.iter_any():
                    frames += 1
                    # Never cut while the target is up: Gradio would cancel the session's jobs.
                    assert phase(wg) is not Phase.COLD
            ended_in = phase(wg)
        assert frames > 4 and time.monotonic() - opened > 1.0
        assert ended_in in (Phase.DRAINING, Phase.COLD)  # closed by the release, not before
        await wait_until(lambda: phase(wg) is Phase.COLD, timeout=10)
        # warmgate closed it itself at the release: no upstream broke
        errors = await metric_value(
            wg.admin, "warmgate_upstream_errors_total", target="wan", kind="reset"
        )
        assert errors == 0, "the heartbeat warmgate closed counted as an upstream reset"


async def test_a_warmup_naming_no_endpoint_fails_with_gradios_own_words(tmp_path: Path) -> None:
    """Gradio answers a traceback; the reason is its last line, the exception."""
    config = gradio_config(tmp_path, warmup={"api_name": "/load_model", "data": []})
    config["targets"]["wan"]["scaling"]["failure_backoff"] = "10m"
    async with warmgate(config, str(tmp_path)) as wg, aiohttp.ClientSession() as session:
        async with session.get(wg.url + PREFIX + "/") as resp:
            assert resp.status == 503
        await wait_until(lambda: phase(wg) is Phase.FAILED, timeout=60)
        reason = wg.runtime("wan").state.reason
    assert "FnIndexInferError: Could not infer function index for API name: load_model" in reason
    assert "Traceback" not in reason and "File " not in reason, reason


async def test_gradio_client_with_its_default_timeouts_through_cold_starts(tmp_path: Path) -> None:
    """httpx's 5 s read timeout (``/config``, ``/info``, ``queue/join``) against cold starts
    longer than that: Client() from cold, and predict() after an idle release, both succeed."""
    backend = gradio_app(tmp_path, GRADIO_IS_E2E_TEST="1", GRADIO_APP_START_DELAY="6")
    config = gradio_config(tmp_path, backend=backend)
    async with warmgate(config, str(tmp_path)) as wg:
        public = wg.url + PREFIX + "/"
        app = await asyncio.to_thread(Client, public, download_files=False, verbose=False)
        try:
            first = await asyncio.to_thread(app.predict, "cat", 0.1, api_name="/generate")
            assert first == "rendered cat (#1 in this session)"
            await wait_until(lambda: phase(wg) is Phase.COLD, timeout=30)  # idle_after: 2 s
            # queue/join to a cold target: held through a second cold start.
            again = await asyncio.to_thread(app.predict, "dog", 0.1, api_name="/generate")
            assert again.startswith("rendered dog")
        finally:
            await asyncio.to_thread(app.close)
        assert await metric_value(wg.admin, "warmgate_cold_starts_total", target="wan") == 2


async def test_a_held_config_whose_start_fails_is_an_error_never_an_answer(tmp_path: Path) -> None:
    """``/config`` held past a second is answered 200 at once, led by whitespace; when the start
    fails, the error follows the whitespace and the body never ends: no client takes it for a
    config."""
    config = gradio_config(tmp_path, warmup={"api_name": "/load_model", "data": []})
    config["targets"]["wan"]["scaling"]["failure_backoff"] = "10m"
    async with warmgate(config, str(tmp_path)) as wg, aiohttp.ClientSession() as session:
        got = b""
        async with session.get(wg.url + PREFIX + "/config") as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in resp.content.iter_any():
                    got += chunk
        assert phase(wg) is Phase.FAILED
    error = json.loads(got)["error"]  # whitespace first, then the error
    assert error["code"] == "target_failed" and "load_model" in error["message"], error
