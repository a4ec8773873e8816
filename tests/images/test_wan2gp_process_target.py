"""The Wan2GP launcher as a ``process`` target of warmgate, as on a workstation: warmgate picks its
``--ready-port`` (``{ready_port}``) and probes ``/readyz`` there (``readiness.port``), runs the
stand-in wgp.py (tests/images/wgp_standin.py) on warmgate's interpreter after ``--``, and fails
the start with the launcher's reason when the preload fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.scale.state import Phase
from tests.helpers import ROOT, one_target, wait_until, warmgate

WGP = ROOT / "tests/images/wgp_standin.py"


JSON = {"Accept": "application/json"}
"""A client that names what it accepts gets the hold's own status (no padded answer)."""


def wan2gp(tmp_path: Path, **env: str) -> dict[str, Any]:
    launcher = ["python", "-m", "warmgate_wan2gp", "--ready-host", "127.0.0.1"]
    launcher += ["--ready-port", "{ready_port}", "--probe-interval", "0.05", "--stop-grace", "5"]
    spec = {
        "engine": "gradio",
        "routes": [{"path_prefix": "/"}],
        "backend": {
            "kind": "process",
            "command": [*launcher, "--", "python", str(WGP), "--server-port", "{port}"],
            "cwd": str(tmp_path),
            "env": {"PYTHONPATH": str(ROOT / "deploy/images/wan2gp"), **env},
            "stop_grace": "10s",
        },
        "readiness": {"path": "/readyz", "port": "{ready_port}", "interval": "50ms"},
        "scaling": {"cold_start_timeout": "60s", "failure_backoff": "10m"},
        "waiting_page": "off",
    }
    return one_target("wan", spec)


async def test_readiness_is_probed_on_the_launchers_own_ready_port(tmp_path: Path) -> None:
    async with (
        warmgate(wan2gp(tmp_path, EAGER_LOAD_MODEL="0")) as wg,
        aiohttp.ClientSession() as client,
        client.get(wg.url + "/config", headers=JSON) as resp,
    ):
        assert resp.status == 200, await resp.text()
        assert resp.headers.get("X-Warmgate-Cold-Start")
        assert wg.runtime("wan").state.phase is Phase.READY


async def test_a_failed_preload_fails_the_start_with_the_launchers_reason(tmp_path: Path) -> None:
    (tmp_path / "release-load").touch()  # the stand-in's load goes on at once, and fails
    empty = tmp_path / "models"
    empty.mkdir()
    config = wan2gp(tmp_path, EAGER_LOAD_MODEL="1", WAN2GP_CHECKPOINTS=str(empty))
    async with warmgate(config) as wg, aiohttp.ClientSession() as client:
        headers = {"Accept": "application/json"}
        async with client.get(wg.url + "/config", headers=headers) as resp:
            assert resp.status == 503
            assert (await resp.json())["error"]["code"] == "target_failed"
        runtime = wg.runtime("wan")
        await wait_until(lambda: runtime.state.phase is Phase.FAILED)
        assert "Unable to locate file 'wan2.1_text2video_14B" in runtime.state.reason


T2V = "wan2.1_text2video_14B_quanto_mbf16_int8.safetensors"


async def test_the_launchers_own_stage_reaches_the_waiting_page(tmp_path: Path) -> None:
    share = tmp_path / "models"
    share.mkdir()
    (share / T2V).touch()
    config = wan2gp(tmp_path, EAGER_LOAD_MODEL="1", WAN2GP_CHECKPOINTS=str(share))
    del config["targets"]["wan"]["waiting_page"]
    async with warmgate(config) as wg, aiohttp.ClientSession() as client:
        runtime = wg.runtime("wan")
        runtime.request_start()
        await wait_until(lambda: runtime.state.stage_message == f"loading {T2V}")
        assert runtime.state.progress is None, "the launcher tells no fraction of its load"
        page = {"Accept": "text/html", "Sec-Fetch-Mode": "navigate"}
        async with client.get(wg.url + "/", headers=page) as resp:
            text = await resp.text()
        assert f"Loading the model. Loading {T2V}." in text.split("<script>")[0]
        async with client.get(wg.url + "/.warmgate/status/wan") as resp:
            status = await resp.json()
        assert status["stage_message"] == f"loading {T2V}" and status["progress"] is None

        (tmp_path / "release-load").touch()
        async with client.get(wg.url + "/config", headers=JSON) as resp:
            assert resp.status == 200
        assert runtime.state.phase is Phase.READY and runtime.state.stage_message == ""


async def test_a_stop_reaches_wgp_as_the_launchers_sigint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="warmgate.process")
    async with warmgate(wan2gp(tmp_path, EAGER_LOAD_MODEL="0")) as wg:
        async with (
            aiohttp.ClientSession() as client,
            client.get(wg.url + "/config", headers=JSON) as resp,
        ):
            assert resp.status == 200
        await wg.runtime("wan").backend.scale_down()
    said = [r.getMessage() for r in caplog.records if r.name == "warmgate.process"]
    assert "[wan] Keyboard interruption in main thread... closing server." in said, said
    assert "[wan] warmgate-wan2gp: stopping: SIGINT to wgp.py" in said
    assert "[wan] stopped (exit code 0)" in said, "the launcher's own clean exit"


LAUNCH_CHECK_FAILED = "ValueError: When localhost is not accessible, a shareable link must be"


async def test_a_wgp_that_dies_in_its_launch_check_once_is_started_again(tmp_path: Path) -> None:
    config = wan2gp(tmp_path, EAGER_LOAD_MODEL="0", STANDIN_LAUNCH_CHECK_DIES=str(tmp_path / "x"))
    async with warmgate(config) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/config", headers={"Accept": "application/json"}) as resp:
            assert resp.status == 200, await resp.text()
        assert (tmp_path / "x").exists(), "the first start died in its launch check"
        assert wg.runtime("wan").state.failures == 0


async def test_a_wgp_that_always_dies_in_its_launch_check_fails_with_its_exception(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="warmgate.lifecycle")
    config = wan2gp(tmp_path, EAGER_LOAD_MODEL="0", STANDIN_LAUNCH_CHECK_DIES="always")
    async with warmgate(config) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/config", headers={"Accept": "application/json"}) as resp:
            assert resp.status == 503
            error = (await resp.json())["error"]
        assert error["code"] == "target_failed" and LAUNCH_CHECK_FAILED in error["message"]
    said = [r.getMessage() for r in caplog.records if r.name == "warmgate.lifecycle"]
    assert sum("started again (1 of 1)" in line for line in said) == 1, said
