"""What warmgate learns and spends survives a restart, on one machine (``state_dir``), and the
stage of a start is told as it goes: the demo engine, started by the process backend, reports
its checkpoint load progress on ``/readyz``, and the waiting page, ``/.warmgate/status`` and
``/targets`` show the start ``loading`` with it; after a restart the first waiting page shows
the cold start learned before, and the day's cloud spend is where it was."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers import ROOT, metric_value, warmgate
from tests.openai_stack import cloud_key, stack  # noqa: F401 - a fixture

PAGE = {"Accept": "text/html,application/xhtml+xml", "Sec-Fetch-Mode": "navigate"}
HELLO = [{"role": "user", "content": "hello"}]


def demo_config(tmp: Path, load_seconds: float) -> dict[str, Any]:
    command = [
        "python",
        "-m",
        "backends.demo_engine",
        "--port",
        "{port}",
        "--checkpoint",
        str(tmp / "checkpoint.bin"),
        "--checkpoint-size",
        "8MiB",
        "--load-seconds",
        str(load_seconds),
    ]
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "state_dir": str(tmp / "state"),
        "targets": {
            "t": {
                "engine": "http",
                "routes": [{"path_prefix": "/"}],
                "backend": {
                    "kind": "process",
                    "command": command,
                    "cwd": str(ROOT),
                    "env": {"EAGER_LOAD_MODEL": "1"},
                    "stop_grace": "2s",
                },
                "readiness": {"path": "/readyz", "interval": "100ms"},
                "scaling": {"expected_cold_start": "90s", "cold_start_timeout": "60s"},
            }
        },
    }


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def poll(http: aiohttp.ClientSession, url: str, until: Any, limit: float = 30.0) -> Any:
    deadline = time.monotonic() + limit
    while True:
        body = await get_json(http, url)
        if until(body):
            return body
        assert time.monotonic() < deadline, f"{url}: last answer {body}"
        await asyncio.sleep(0.05)


async def test_a_process_start_shows_the_engines_load_progress_and_its_eta_survives(
    tmp_path: Path,
) -> None:
    config = demo_config(tmp_path, load_seconds=3.0)
    async with warmgate(config, base_dir=str(tmp_path)) as wg, aiohttp.ClientSession() as http:
        status = f"{wg.url}/.warmgate/status/t"
        first = await get_json(http, status)
        assert first["eta"] == 90.0  # scaling.expected_cold_start, before any start
        async with http.get(wg.url + "/", headers=PAGE) as resp:
            assert resp.status == 503  # the waiting page: it starts the engine
        loading = await poll(
            http, status, lambda s: s["stage"] == "loading" and s["progress"] is not None
        )
        assert loading["stage_text"] == "loading the model"
        assert 0.0 <= loading["progress"] < 1.0
        later = await poll(http, status, lambda s: (s["progress"] or 0) > loading["progress"])
        assert later["phase"] == "starting"
        targets = await get_json(http, wg.admin + "/targets")
        assert targets["t"]["stage"] == "loading" and targets["t"]["progress"] is not None
        async with http.get(wg.url + "/", headers=PAGE) as resp:
            page = await resp.text()
        assert re.search(r"Loading the model \(\d+%\)\.", page), page
        await poll(http, status, lambda s: s["ready"])
        learned = (await get_json(http, status))["eta"]
        assert 3.0 <= learned < 30.0
        loading_seconds = await metric_value(
            wg.admin, "warmgate_cold_start_stage_seconds_sum", target="t", stage="loading"
        )
        assert loading_seconds >= 2.5  # most of the paced 3 s load
    assert (tmp_path / "state" / "t.cold-start.json").is_file()

    async with warmgate(config, base_dir=str(tmp_path)) as wg, aiohttp.ClientSession() as http:
        status = await get_json(http, f"{wg.url}/.warmgate/status/t")
        assert status["eta"] == learned  # not 90 s: what the last run learned
        async with http.get(wg.url + "/", headers=PAGE) as resp:
            page = await resp.text()
        assert f"about {learned:.0f} s expected" in page


async def test_a_corrupt_state_file_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "t.cold-start.json").write_text('{"version": 1, "starts": [')
    config = demo_config(tmp_path, load_seconds=0.0)
    async with warmgate(config, base_dir=str(tmp_path)) as wg, aiohttp.ClientSession() as http:
        assert (await get_json(http, f"{wg.url}/.warmgate/status/t"))["eta"] == 90.0
    assert "ignoring unreadable state" in caplog.text


@pytest.mark.usefixtures("cloud_key")
async def test_the_days_cloud_spend_survives_a_restart(tmp_path: Path) -> None:
    def keep(config: dict[str, Any]) -> None:
        config["state_dir"] = str(tmp_path / "state")

    async with stack(tweak=keep, daily_cloud_budget_usd=1.0) as st:
        client = st.client()
        for _ in range(3):
            await client.chat.completions.create(model="frontier", messages=HELLO, max_tokens=5)
        await client.close()
        spent, left = st.api.budget.spent, st.api.budget.left()
        assert spent > 0 and left < 1.0
    async with stack(tweak=keep, daily_cloud_budget_usd=1.0) as st:  # restarted, same day
        assert st.api.budget.left() == pytest.approx(left)
        assert st.api.budget.spent == pytest.approx(spent)
        remaining = await metric_value(st.wg.admin, "warmgate_cloud_budget_remaining_usd")
        assert remaining == pytest.approx(left)
