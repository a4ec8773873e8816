"""``warmgate status``: the real command against a running warmgate's admin listener (a process
target that cold-starts for real, and the OpenAI-compatible API), and with the listener down."""

from __future__ import annotations

import asyncio
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from router.status import render
from tests.helpers import ROOT, free_port, wait_until, warmgate
from tests.openai_stack import base_config


def sleepy(idle_after: str = "10m") -> dict[str, Any]:
    return {
        "routes": [{"path_prefix": "/"}],
        "backend": {
            "kind": "process",
            "command": ["python", "-m", "tests.sleepy_engine", "--port", "{port}", "--load", "0.3"],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"path": "/readyz", "interval": "50ms"},
        "scaling": {"idle_after": idle_after},
    }


def config() -> dict[str, Any]:
    data = base_config(None, "http://127.0.0.1:9")
    data["targets"]["sleepy"] = sleepy()
    return data


async def status(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "router",
        "status",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def rows(text: str) -> dict[str, list[str]]:
    """First word of each line -> the line's columns (split on runs of 3+ spaces)."""
    out = {}
    for line in text.splitlines():
        if line.strip():
            cells = re.split(r"\s{3,}", line.strip())
            out[cells[0]] = cells
    return out


async def test_status_shows_the_targets_and_models_of_a_running_warmgate() -> None:
    async with warmgate(config()) as wg, aiohttp.ClientSession() as session:
        code, out, err = await status("--admin", wg.admin)
        assert code == 0, err
        table = rows(out)
        assert table["NAME"] == [
            "NAME", "PHASE", "STAGE", "HELD", "IN-FLIGHT", "IDLE", "GPU-S TODAY", "ETA"
        ]  # fmt: skip
        assert table["sleepy"][:5] == ["sleepy", "cold", "-", "0", "0"]
        assert table["sleepy"][-1].startswith("~"), "a cold target shows its ETA"
        assert table["vllm-local"][1] == "ready", "always on"
        assert table["MODEL"][:4] == ["MODEL", "KIND", "DECISIONS (1H)", "CLOUD SPEND TODAY"]
        assert table["qwen3-8b"][1] == "chat" and table["embed"][1] == "embeddings"
        assert "cloud budget" in out and "of $25.00" in out

        # A request wakes the target; afterwards it is ready, with its cold start counted.
        async with session.get(wg.url + "/hello") as response:
            assert response.status == 200
        code, out, err = await status("--admin", wg.admin.removeprefix("http://"))
        assert code == 0, err
        sleepy_row = rows(out)["sleepy"]
        assert sleepy_row[1] == "ready" and sleepy_row[-1] == "-"

        code, out, err = await status("--admin", wg.admin, "--json")
        assert code == 0, err
        view = json.loads(out)
        target = view["targets"]["sleepy"]
        assert target["phase"] == "ready" and target["stage"] is None
        (start,) = target["cold_starts_today"]
        assert start["outcome"] == "ready" and start["seconds"] >= 0.3
        assert set(view["api"]["models"]) == set(config()["models"])
        assert view["api"]["budget"]["limit"] == 25


async def test_status_watch_shows_the_phase_change(tmp_path: Path) -> None:
    data = {**config(), "targets": {"sleepy": sleepy(idle_after="1s")}, "models": {}}
    async with warmgate(data) as wg, aiohttp.ClientSession() as session:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "router", "status", "--admin", wg.admin, "--watch", "--interval", "0.2"),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            seen: list[str] = []

            async def read() -> None:
                assert proc.stdout is not None
                async for line in proc.stdout:
                    seen.append(line.decode())

            reader = asyncio.create_task(read())
            await wait_until(lambda: any("cold" in line for line in seen))
            async with session.get(wg.url + "/hello") as response:
                assert response.status == 200
            await wait_until(lambda: any(" ready " in line for line in seen))
            ready = next(i for i, line in enumerate(seen) if " ready " in line)
            # Released after idle_after: cold again, with the GPU-seconds it was held counted.
            await wait_until(lambda: any(" cold " in line for line in seen[ready:]), timeout=15)
            released = next(line for line in seen[ready:] if " cold " in line)
            assert re.search(r"\s[1-9]\d* \(\d+ busy\)", released), released
        finally:
            proc.terminate()
            await proc.wait()
            await reader


async def test_status_with_the_admin_listener_down(tmp_path: Path) -> None:
    port = free_port()
    code, out, err = await status("--admin", f"http://127.0.0.1:{port}")
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"warmgate: cannot reach the admin listener at http://127.0.0.1:{port}: Connection refused"
    ]
    # --config takes the admin listener from a config file.
    path = tmp_path / "warmgate.yaml"
    data = {**config(), "models": {}, "clouds": {}, "admin_listen": f"127.0.0.1:{port}"}
    path.write_text(yaml.safe_dump(data))
    code, out, err = await status("--config", str(path))
    assert code == 1 and f"http://127.0.0.1:{port}: Connection refused" in err


def test_a_stage_and_parked_gpu_seconds_show_where_they_exist() -> None:
    """What the view will carry once starts have stages and targets a parked tier."""
    target = {
        "phase": "starting",
        "stage": "pulling",
        "since": 100.0,
        "held": 3,
        "in_flight": 0,
        "idle_since": None,
        "eta": 40.0,
        "gpu_seconds_today": {"busy": 10.0, "idle": 5.0, "parked": 20.0},
    }
    out = io.StringIO()
    render({"now": 110.0, "targets": {"comfyui": target}, "api": None}, out)
    assert rows(out.getvalue())["comfyui"] == [
        "comfyui", "starting", "pulling", "3", "0", "-", "35 (10 busy)", "~30s left"
    ]  # fmt: skip
    # As the dashboard's card and chart count them: starting time included.
    hours = {"busy": 10 / 3600, "idle": 5 / 3600, "parked": 20 / 3600, "starting": 15 / 3600}
    out = io.StringIO()
    render({"now": 110.0, "targets": {"comfyui": {**target, "gpu_hours_today": hours}}}, out)
    assert rows(out.getvalue())["comfyui"][6] == "50 (10 busy)"
