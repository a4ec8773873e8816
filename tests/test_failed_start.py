"""A start the engine itself says failed, end to end: a process whose ``/readyz`` answers as
the ComfyUI image's readiness node does when its checkpoint cannot load (503 ``{"stage":
"failed", "error": ...}`` from the moment it listens). The start fails at once with the
engine's reason: held requests, the waiting page and ``/targets`` say it, and the backoff
holds off the next try."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp

from router.scale.state import Phase
from tests.helpers import metric_value, one_target, warmgate

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


async def test_a_readyz_that_says_failed_fails_held_requests_with_its_reason(
    tmp_path: Path,
) -> None:
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    spec = {
        "engine": "comfyui",
        "routes": [{"path_prefix": "/comfy", "strip_prefix": True}],
        "backend": {"kind": "process", "command": [sys.executable, str(script), "{port}"]},
        "readiness": {"path": "/readyz", "interval": "50ms"},
        # a start that waited for its timeout would hang the test: it fails at once instead
        "scaling": {"cold_start_timeout": "10m", "failure_backoff": "10m"},
    }
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
        assert "failed to start" in page and "FileNotFoundError" in page.split("<script>")[0]
        async with client.get(wg.admin + "/targets") as resp:
            listed = str(await resp.json())
        assert REASON in listed

        # The backoff: the next request is answered at once, no second start is made.
        async with client.post(wg.url + "/comfy/prompt", json={"prompt": {}}) as resp:
            assert resp.status == 503 and int(resp.headers["Retry-After"]) > 60
            again = (await resp.json())["error"]
        assert again["code"] == "target_failed" and REASON in again["message"]
        assert await metric_value(wg.admin, "warmgate_cold_starts_total", target="comfy") == 1
