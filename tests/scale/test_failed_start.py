"""A start the engine itself says failed, end to end: a process whose ``/readyz`` answers as
the ComfyUI image's readiness node does when its checkpoint cannot load (503 ``{"stage":
"failed", "error": ...}`` from the moment it listens). The start fails at once with the
engine's reason: held requests, the waiting page and ``/targets`` say it, and the backoff
holds off the next try."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import aiohttp
import pytest

from backends.outside import ERROR_CHARS
from router.scale.state import Phase
from tests.helpers import metric_value, one_target, wait_until, warmgate

REASON = (
    "does-not-exist.safetensors: FileNotFoundError: Model in folder 'checkpoints' with "
    "filename 'does-not-exist.safetensors' not found."
)
PAGE = {"Accept": "text/html", "Sec-Fetch-Mode": "navigate"}

ENGINE = f"""
import sys
from aiohttp import web

async def readyz(request):
    body = {{"stage": "failed", "progress": 0.0, "loaded": [], "eager": True,
            "checkpoints": ["does-not-exist.safetensors"], "error": {REASON!r}}}
    return web.json_response(body, status=503)

app = web.Application()
app.router.add_get("/readyz", readyz)
app.router.add_get("/api/readyz", readyz)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def failing_engine(script: Path) -> dict[str, object]:
    return {
        "engine": "comfyui",
        "routes": [{"path_prefix": "/comfy", "strip_prefix": True}],
        "backend": {"kind": "process", "command": [sys.executable, str(script), "{port}"]},
        "readiness": {"path": "/readyz", "interval": "50ms"},
        # a start that waited for its timeout would hang the test: it fails at once instead
        "scaling": {"cold_start_timeout": "10m", "failure_backoff": "10m"},
    }


async def test_a_readyz_that_says_failed_fails_held_requests_with_its_reason(
    tmp_path: Path,
) -> None:
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    spec = failing_engine(script)
    async with warmgate(one_target("comfy", spec)) as wg, aiohttp.ClientSession() as client:
        runtime = wg.runtime("comfy")
        async with client.post(wg.url + "/comfy/prompt", json={"prompt": {}}) as resp:
            assert resp.status == 503
            error = (await resp.json())["error"]
        assert error["code"] == "target_failed"
        assert REASON in error["message"], error
        assert runtime.state.phase is Phase.FAILED and runtime.state.reason == REASON

        async with client.get(wg.url + "/.warmgate/status/comfy") as resp:
            status = await resp.json()
        assert status["phase"] == "failed" and REASON in str(status["failure"])
        async with client.get(wg.url + "/comfy/", headers=PAGE) as resp:
            page = await resp.text()
        shown = page.split("<script>")[0]
        assert "failed to start" in shown and "FileNotFoundError" in shown
        assert "not found. warmgate tries again in " in shown, "one full stop, not two"
        async with client.get(wg.admin + "/targets") as resp:
            listed = str(await resp.json())
        assert REASON in listed

        # The backoff: the next request is answered at once, no second start is made.
        async with client.post(wg.url + "/comfy/prompt", json={"prompt": {}}) as resp:
            assert resp.status == 503 and int(resp.headers["Retry-After"]) > 60
            again = (await resp.json())["error"]
        assert again["code"] == "target_failed" and REASON in again["message"]
        assert await metric_value(wg.admin, "warmgate_cold_starts_total", target="comfy") == 1


HOSTILE = (
    "checkpoint \ud800.safetensors not found\r\n"
    "2026-12-05 09:00:00,000 ERROR warmgate.lifecycle forged record\x1b[2J\x00" + "x" * 200_000
)


async def test_an_engines_hostile_failure_reaches_pages_json_logs_as_one_bounded_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """200 kB of error with CR/LF, ESC, NUL and a lone surrogate (valid JSON): every page and
    answer works, each carries it as one line of ERROR_CHARS, and no log record carries it raw."""
    script = tmp_path / "engine.py"
    script.write_text(ENGINE.replace(repr(REASON), repr(HOSTILE)))
    spec = failing_engine(script)
    caplog.set_level(logging.INFO)
    async with warmgate(one_target("comfy", spec)) as wg, aiohttp.ClientSession() as client:
        async with client.post(wg.url + "/comfy/prompt", json={"prompt": {}}) as resp:
            assert resp.status == 503
            message = (await resp.json())["error"]["message"]
        assert "forged record" in message and len(message) < ERROR_CHARS + 200
        assert not set(message) & set("\r\n\x1b\x00\ud800")
        async with client.get(wg.url + "/.warmgate/status/comfy") as resp:
            assert resp.status == 200
            failure = str((await resp.json())["failure"])
        assert len(failure) < ERROR_CHARS + 200 and "\x1b" not in failure
        for url in (wg.url + "/comfy/", wg.url + "/comfy/anything"):
            async with client.get(url, headers=PAGE) as resp:
                assert resp.status in (200, 503), resp.status
                page = await resp.text()
            assert "forged record" in page and "\x1b" not in page and len(page) < 100_000
        async with client.get(wg.admin + "/") as resp:
            assert resp.status == 200
            assert len(await resp.text()) < 200_000
        async with client.get(wg.admin + "/targets") as resp:
            assert resp.status == 200
            listed = json.dumps(await resp.json())
        assert len(listed) < 100_000
    said = [r.getMessage() for r in caplog.records if "forged record" in r.getMessage()]
    assert said, "the failure is logged"
    for line in said:
        assert not set(line) & set("\r\x1b\x00\ud800"), line[:200]
        assert "\n2026-12-05" not in line and len(line) < 2 * ERROR_CHARS + 200


FAILS_ONCE = """
import pathlib, sys
from aiohttp import web

tried = pathlib.Path(sys.argv[2])
if not tried.exists():
    tried.touch()
    sys.exit("RuntimeError: CUDA error: out of memory")

async def readyz(request):
    return web.json_response({"stage": "loading", "progress": 0.5}, status=503)

app = web.Application()
app.router.add_get("/readyz", readyz)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


async def test_the_waiting_page_of_a_start_tried_again_after_a_failure_says_so(
    tmp_path: Path,
) -> None:
    script = tmp_path / "engine.py"
    script.write_text(FAILS_ONCE)
    spec = {
        "routes": [{"path_prefix": "/"}],
        "backend": {
            "kind": "process",
            "command": [sys.executable, str(script), "{port}", str(tmp_path / "tried")],
        },
        "readiness": {"path": "/readyz", "interval": "50ms"},
        # no retry at once (scaling.start_retries): the failure is answered, then its backoff
        "scaling": {"cold_start_timeout": "10m", "failure_backoff": "200ms", "start_retries": 0},
    }
    async with warmgate(one_target("t", spec)) as wg, aiohttp.ClientSession() as client:
        runtime = wg.runtime("t")
        async with client.get(wg.url + "/", headers={"Accept": "application/json"}) as resp:
            assert resp.status == 503
        assert runtime.state.phase is Phase.FAILED
        await wait_until(lambda: runtime.loop.time() > runtime.state.retry_at)
        async with client.get(wg.url + "/", headers=PAGE) as resp:
            assert resp.status == 503  # the start is tried again
        await wait_until(lambda: runtime.state.phase is Phase.STARTING)
        async with client.get(wg.url + "/.warmgate/status/t") as resp:
            status = await resp.json()
        assert status["retrying"] is True and status["phase"] == "starting"
        async with client.get(wg.url + "/", headers=PAGE) as resp:
            shown = (await resp.text()).split("<script>")[0]
        assert "last start failed; warmgate is starting it again" in shown
        assert "asleep" not in shown
