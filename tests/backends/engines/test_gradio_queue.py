"""Gradio's queue/data streams count only while a job they carry runs, against a real Gradio app
(tests/gradio_app.py) on the version Wan2GP pins (5.29, in the test-only environment
``make gradio529`` builds) and on the current one, spoken to through warmgate as Gradio's page
does (raw SSE over aiohttp).

Gradio's page sometimes leaves a session's ``queue/data`` stream open after its jobs are done,
carrying only ``{"msg": "heartbeat", "event_id": null}`` every 15 s: reopening that stream for a
session whose jobs are finished is exactly such a stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.scale.state import Phase
from tests.helpers import ROOT, Running, gradio_app, metric_value, wait_until, warmgate

PREFIX = "/wan"
GRADIO529 = ROOT / ".venv-gradio529"


def gradio529_python() -> str:
    python = GRADIO529 / "bin" / "python"
    found = list(GRADIO529.glob("lib/python*/site-packages/gradio-5.29.*.dist-info"))
    if not python.exists() or not found:
        pytest.skip(
            "Gradio 5.29 (the version Wan2GP pins) is not installed in .venv-gradio529: "
            "`make gradio529` builds it (it needs PyPI)"
        )
    return str(python)


@pytest.fixture(params=["5.29", "current"])
def python(request: pytest.FixtureRequest) -> str:
    return gradio529_python() if request.param == "5.29" else sys.executable


def config(tmp_path: Path, python: str) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {
            "wan": {
                "engine": "gradio",
                "routes": [{"path_prefix": PREFIX, "strip_prefix": True}],
                "backend": gradio_app(tmp_path, python),
                "readiness": {"interval": "100ms"},
                "scaling": {
                    "idle_after": "4s",
                    # Gradio's own queue is not asked: only the streams keep the target up here.
                    "busy_poll": "1h",
                    "stream_activity_window": "500ms",
                    "cold_start_timeout": "90s",
                },
                "waiting_page": "off",
            }
        },
    }


def phase(wg: Running) -> Phase:
    return wg.runtime("wan").state.phase  # type: ignore[no-any-return]


async def messages(
    http: aiohttp.ClientSession, url: str, seen: list[dict[str, Any]], until: str | None = None
) -> None:
    """Read the event stream at ``url`` into ``seen`` until a message ``until`` (or its end)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with http.get(url, timeout=timeout) as response:
        assert response.status == 200, await response.text()
        buffer = b""
        async for chunk in response.content.iter_any():
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                data = [line[5:].strip() for line in event.split(b"\n") if line[:5] == b"data:"]
                if data:
                    seen.append(json.loads(b"\n".join(data)))
                    if seen[-1]["msg"] == until:
                        return


async def join(
    http: aiohttp.ClientSession, api: str, fn_index: int, data: list[Any], session: str
) -> None:
    body = {
        "data": data,
        "fn_index": fn_index,
        "session_hash": session,
        "event_data": None,
        "trigger_id": None,
    }
    async with http.post(f"{api}/queue/join", json=body) as response:
        assert response.status == 200, await response.text()


async def test_a_queue_stream_is_busy_only_while_a_job_it_carries_runs(
    tmp_path: Path, python: str
) -> None:
    async with warmgate(config(tmp_path, python), str(tmp_path)) as wg:
        activity = wg.runtime("wan").activity
        async with aiohttp.ClientSession() as http:
            # The first request wakes the target and is held through the cold start.
            async with http.get(f"{wg.url}{PREFIX}/config", timeout=120) as response:
                app = await response.json()
            api = f"{wg.url}{PREFIX}{app['api_prefix']}"
            fn = {d.get("api_name"): d["id"] for d in app["dependencies"]}

            # A tab: one quick job, read to close_stream; then its stream opened again, with
            # no job behind it.
            tab: list[dict[str, Any]] = []
            await join(http, api, fn["events"], [], "tab")
            await messages(http, f"{api}/queue/data?session_hash=tab", tab, "close_stream")
            assert [m["msg"] for m in tab][-2:] == ["process_completed", "close_stream"]
            idle: list[dict[str, Any]] = []
            idle_stream = asyncio.ensure_future(
                messages(http, f"{api}/queue/data?session_hash=tab", idle)
            )
            await wait_until(lambda: len(activity.streams) == 1)
            assert activity.in_flight == 0, "a stream with no job behind it is no activity"

            # Another session: a job silent for 16 s (idle_after is 4 s), longer than the
            # 15 s between the idle stream's heartbeats.
            job: list[dict[str, Any]] = []
            await join(http, api, fn["generate"], ["cat", 16.0, None], "job")
            job_stream = asyncio.ensure_future(
                messages(http, f"{api}/queue/data?session_hash=job", job, "close_stream")
            )
            await wait_until(lambda: activity.in_flight == 1)
            while not job_stream.done():
                assert phase(wg) is Phase.READY, "released while a job was running"
                await asyncio.sleep(0.1)
            await job_stream
            kinds = [m["msg"] for m in job]
            assert "process_starts" in kinds and kinds[-2:] == ["process_completed", "close_stream"]
            assert [m["msg"] for m in idle] and {m["msg"] for m in idle} == {"heartbeat"}
            assert all(m["event_id"] is None for m in idle)

            # Only the heartbeat stream is left open: the target goes at idle_after.
            async with http.get(f"{wg.admin}/targets") as response:
                shown = (await response.json())["wan"]
            assert (shown["in_flight"], shown["streams"]) == (0, 1)
            assert shown["idle_seconds"] is not None
            await wait_until(lambda: phase(wg) is Phase.COLD, timeout=30)
            # Ended at the release with Gradio's own last word, its body ended cleanly.
            await asyncio.wait_for(idle_stream, 10)
            assert idle[-1]["msg"] == "close_stream"
        errors = await metric_value(
            wg.admin, "warmgate_upstream_errors_total", target="wan", kind="reset"
        )
        assert errors == 0


async def test_a_heartbeat_open_across_a_release_counts_no_upstream_reset(
    tmp_path: Path, python: str
) -> None:
    """A tab's heartbeat (Gradio's own rate, 15 s) stays open until the release closes it:
    warmgate's doing, so no ``reset`` is counted against the engine (issue 22, defect 6)."""
    async with warmgate(config(tmp_path, python), str(tmp_path)) as wg:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{wg.url}{PREFIX}/config", timeout=120) as response:
                app = await response.json()
            url = f"{wg.url}{PREFIX}{app['api_prefix']}/heartbeat/tab"
            timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
            async with http.get(url, timeout=timeout) as response:
                assert response.status == 200
                with contextlib.suppress(aiohttp.ClientPayloadError):
                    async for _ in response.content.iter_any():
                        pass  # until the release ends it
        await wait_until(lambda: phase(wg) is Phase.COLD, timeout=30)
        errors = await metric_value(
            wg.admin, "warmgate_upstream_errors_total", target="wan", kind="reset"
        )
        assert errors == 0


async def test_a_queue_stream_of_no_session_ends_with_close_stream_and_no_reset(
    tmp_path: Path,
) -> None:
    """A tab's ``queue/data`` stream for a session Gradio does not know (a tab of a process that
    is gone): Gradio 5.50 answers an ``unexpected_error`` and drops the connection without the
    end of its chunked body. The client reads Gradio's ``close_stream`` after it and a clean
    end, and no ``reset`` is counted against the engine, then or at the release."""
    async with warmgate(config(tmp_path, sys.executable), str(tmp_path)) as wg:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{wg.url}{PREFIX}/config", timeout=120) as response:
                app = await response.json()
            url = f"{wg.url}{PREFIX}{app['api_prefix']}/queue/data?session_hash=nobody"
            seen: list[dict[str, Any]] = []
            await messages(http, url, seen, until="close_stream")  # a cut body raises here
            assert seen[-1]["msg"] == "close_stream"
        await wait_until(lambda: phase(wg) is Phase.COLD, timeout=30)
        errors = await metric_value(
            wg.admin, "warmgate_upstream_errors_total", target="wan", kind="reset"
        )
        assert errors == 0
