"""What warmgate learns and spends survives a restart, on one machine (``state_dir``), and the
stage of a start is told as it goes: the demo engine, started by the process backend, reports
its checkpoint load progress on ``/readyz``, and the waiting page, ``/.warmgate/status`` and
``/targets`` show the start ``loading`` with it; after a restart the first waiting page shows
the cold start learned before, and the day's cloud spend is where it was. So does what a wake
from parked takes: a restarted warmgate predicts the wake it learned, before any new one."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.scale.wakes import Wakes
from tests.helpers import ROOT, Subprocess, metric_value, wait_until, warmgate
from tests.openai_stack import cloud_key, stack  # noqa: F401 - a fixture
from tests.scale.test_parked import config as parking_config
from tests.scale.test_parked import demo, parked, prompt, rendered

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


def parking(tmp: Path) -> dict[str, Any]:
    """The demo engine, parked after a second idle; a wake expected to take 45 s until seen."""
    target = demo("comfy", tmp, expected_wake="45s")
    return parking_config({"comfy": target}, state_dir=str(tmp / "state"))


async def test_the_learned_wake_survives_a_restart(tmp_path: Path) -> None:
    data = parking(tmp_path)
    async with warmgate(data, str(tmp_path)) as wg, aiohttp.ClientSession() as http:
        runtime, url = wg.runtime("comfy"), wg.url + "/comfy"
        view = await get_json(http, wg.admin + "/status")
        assert view["targets"]["comfy"]["parked"]["wake_eta"] == 45
        for _ in range(2):  # a cold start, then a wake from parked
            prompt_id, _ = await prompt(http, url)
            await rendered(http, url, prompt_id)
            await wait_until(lambda: parked(runtime), timeout=20)
        assert await metric_value(wg.admin, "warmgate_wake_seconds_count", target="comfy") == 1
        learned = runtime.learned.wakes.predicted()
        assert 0 < learned < 45
    kept = json.loads((tmp_path / "state" / "comfy.wake.json").read_text())
    assert kept == {"version": 1, "wakes": [learned]}

    async with warmgate(data, str(tmp_path)) as wg, aiohttp.ClientSession() as http:
        shown = (await get_json(http, wg.admin + "/status"))["targets"]["comfy"]["parked"]
        assert (shown["wake_eta"], shown["wakes_seen"]) == (round(learned, 2), 1)  # not 45 s
        assert wg.runtime("comfy").learned.wakes.predicted() == learned
        assert await metric_value(wg.admin, "warmgate_wake_seconds_count", target="comfy") == 0


@pytest.mark.parametrize(
    ("kept", "warning"),
    [
        ('{"version": 1, "wakes": [0.4, ', "ignoring unreadable state"),
        ('{"version": 1, "wakes": ["fast"]}', "comfy: ignoring wakes in"),
        ('{"version": 1, "wakes": [0.4, Infinity]}', "comfy: ignoring wakes in"),
        ('{"version": 2, "wakes": [0.4]}', "comfy: ignoring wakes in"),
    ],
)
async def test_a_damaged_wake_document_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kept: str, warning: str
) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "comfy.wake.json").write_text(kept)
    async with warmgate(parking(tmp_path), str(tmp_path)) as wg, aiohttp.ClientSession() as http:
        shown = (await get_json(http, wg.admin + "/status"))["targets"]["comfy"]["parked"]
        assert (shown["wake_eta"], shown["wakes_seen"]) == (45, 0)  # relearned from the start
    assert warning in caplog.text


def test_a_wake_document_round_trips_and_what_it_cannot_be_is_refused() -> None:
    wakes = Wakes(45.0)
    for seconds in (0.8, 1.1, 0.9):
        wakes.record(seconds)
    again = Wakes(45.0)
    assert again.load(json.loads(json.dumps(wakes.to_json())))
    assert (list(again.history), again.predicted()) == (list(wakes.history), wakes.predicted())
    assert again.load({"version": 1, "wakes": []}) and again.predicted() == 45.0
    for bad in ({"wakes": [1.0]}, {"version": 1}, {"version": 1, "wakes": [True]}):
        assert not again.load(bad)
    assert again.predicted() == 45.0, "a refused document changes nothing"


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


HOSTILE_STATE = {
    "t.timeline.json": '{"v": 1, "until": 1, "segments": [[-Infinity, "cold"]], "marks": '
    '[{"at": 1, "kind": "wake", "held": 1e400, "seconds": null}]}',
    "t.idle.json": '{"version": 1, "ratio": 1.08, "gaps": 1e400, "bins": {}}',
    "t.cold-start.json": f'{{"version": 1, "starts": [{10**400}], "stages": {{}}}}',
    "t.wake.json": '{"version": 1, "wakes": [' + "[" * 100_000 + "]" * 100_000 + "]}",
}


async def test_a_hostile_state_dir_neither_stops_the_start_nor_the_release(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each document is ignored with one warning that names its file; the target starts, is
    used and is released when idle, as without them."""
    state = tmp_path / "state"
    state.mkdir()
    for name, text in HOSTILE_STATE.items():
        (state / name).write_text(text)
    config = demo_config(tmp_path, load_seconds=0.0)
    config["targets"]["t"]["scaling"].update(idle_after="auto", idle_bounds=["1s", "1s"])
    async with warmgate(config, base_dir=str(tmp_path)) as wg, aiohttp.ClientSession() as http:
        status = f"{wg.url}/.warmgate/status/t"
        assert (await get_json(http, status))["eta"] == 90.0  # relearned
        async with http.get(wg.url + "/") as resp:
            assert resp.status == 200
        await poll(http, status, lambda s: s["phase"] == "cold")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    for name in HOSTILE_STATE:
        assert len([line for line in warned if str(state / name) in line]) == 1, (name, warned)
    assert all("\n" not in line for line in warned)


def test_a_fifo_in_place_of_a_state_file_is_not_waited_on(tmp_path: Path) -> None:
    """A FIFO (or a device) is not a document: warmgate serve starts, answers /healthz and
    stops on SIGTERM, where a read of it would have blocked the loop for good."""
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "t.timeline.json")
    os.mkfifo(state / "t.cold-start.json")
    config = demo_config(tmp_path, load_seconds=0.0)
    config["state_dir"] = str(state)
    served = Subprocess(config, tmp_path)
    try:
        served.start()
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(served.admin + "/healthz", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, served.log.read_text()
                time.sleep(0.1)
        assert served.terminate(timeout=20) == 0
    finally:
        served.stop()
    assert "not a regular file" in served.log.read_text()
