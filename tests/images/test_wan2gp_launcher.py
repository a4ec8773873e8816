"""warmgate's Wan2GP launcher (deploy/images/wan2gp/warmgate_wan2gp) as the image runs it: a real
subprocess running a stand-in of wgp.py (wgp_standin.py) that reads wgp_config.json, preloads at
module level with Wan2GP's log lines and only then opens its port; /readyz read over loopback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "deploy/images/wan2gp"
WGP = Path(__file__).resolve().parent / "wgp_standin.py"
T2V = "wan2.1_text2video_14B_quanto_mbf16_int8.safetensors"

sys.path.insert(0, str(LAUNCHER))
from warmgate_wan2gp import readiness, wgpconfig  # noqa: E402

sys.path.remove(str(LAUNCHER))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Run:
    proc: asyncio.subprocess.Process
    cwd: Path
    ready_port: int
    app_port: int
    log: Path
    seen: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    async def readyz(self) -> tuple[int, dict[str, Any]] | None:
        """None while nothing listens."""
        url = f"http://127.0.0.1:{self.ready_port}/readyz"
        try:
            async with aiohttp.ClientSession() as session, session.get(url) as resp:
                answer = resp.status, await resp.json()
        except aiohttp.ClientConnectionError:
            return None
        self.seen.append(answer)
        return answer

    async def until(self, check: Callable[[int, dict[str, Any]], bool]) -> dict[str, Any]:
        deadline = time.monotonic() + 20
        last = None
        while time.monotonic() < deadline:
            last = await self.readyz()
            if last is not None and check(*last):
                return last[1]
            if self.proc.returncode is not None:
                break
            await asyncio.sleep(0.02)
        raise AssertionError(f"/readyz never matched; last {last}\n{self.output()}")

    def release_load(self) -> None:
        (self.cwd / "release-load").touch()

    def config(self) -> dict[str, Any]:
        return json.loads((self.cwd / "wgp_config.json").read_text())

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def exit_code(self) -> int:
        return await asyncio.wait_for(self.proc.wait(), 30)


@pytest.fixture
async def launch(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    runs: list[Run] = []

    async def start(*options: str, **env: str) -> Run:
        own = ("EAGER_", "WAN2GP_", "HF_")
        environ = {k: v for k, v in os.environ.items() if not k.startswith(own)}
        environ.update(env, PYTHONPATH=str(LAUNCHER), PYTHONUNBUFFERED="1")
        ready_port, app_port = free_port(), free_port()
        log = tmp_path / "launcher.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "warmgate_wan2gp"),
                *("--ready-host", "127.0.0.1", "--ready-port", str(ready_port)),
                *("--probe-interval", "0.02", "--stop-grace", "5", "--launch-check", "0"),
                *options,
                *("--", sys.executable, str(WGP), "--listen", "--server-port", str(app_port)),
                cwd=tmp_path,
                env=environ,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        run = Run(proc, tmp_path, ready_port, app_port, log)
        runs.append(run)
        return run

    yield start

    for run in runs:
        if run.proc.returncode is None:
            run.proc.kill()
            await run.proc.wait()
        pid_file = run.cwd / "wgp.pid"
        if pid_file.exists() and pid_alive(pid := int(pid_file.read_text())):
            os.kill(pid, signal.SIGKILL)


def models(tmp_path: Path, *names: str) -> str:
    share = tmp_path / "models/wan2gp"
    share.mkdir(parents=True, exist_ok=True)
    for name in names:
        (share / name).write_bytes(b"weights")
    return str(share)


async def test_eager_load_then_ready_then_a_clean_stop(launch: Any, tmp_path: Path) -> None:
    share = models(tmp_path, T2V)
    run = await launch(EAGER_LOAD_MODEL="1", WAN2GP_MODEL="t2v", WAN2GP_CHECKPOINTS=share)
    body = await run.until(lambda s, b: b["stage"] == "loading")
    assert run.seen[-1][0] == 503
    assert body == {  # no progress: Wan2GP tells none, and a 0 would be read as one
        "stage": "loading",
        "loaded": [],
        "eager": True,
        "loading": [T2V],
        "message": f"loading {T2V}",
    }
    assert all("progress" not in b for _, b in run.seen)
    assert all(b["message"] == "wgp.py starting" for _, b in run.seen if b["stage"] == "starting")
    config = run.config()
    assert config["preload_model_policy"] == ["P"]
    assert config["last_model_type"] == "t2v" and config["checkpoints_paths"] == [share]
    assert config["attention_mode"] == "auto", "a new file gets Wan2GP's defaults"
    await asyncio.sleep(0.1)
    assert (await run.readyz() or (0, {}))[0] == 503, "still loading: the port is not open"

    run.release_load()
    body = await run.until(lambda s, b: s == 200)
    assert body == {"stage": "ready", "progress": 1.0, "loaded": [T2V], "eager": True}
    assert all(status == 503 for status, b in run.seen if b["stage"] != "ready")
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{run.app_port}/config") as resp,
    ):
        assert resp.status == 200  # the app itself serves on its own port

    wgp_pid = int((run.cwd / "wgp.pid").read_text())
    run.proc.send_signal(signal.SIGTERM)
    assert await run.exit_code() == 0
    assert not pid_alive(wgp_pid)
    output = run.output()
    assert f"Loading Model '{T2V}' ..." in output, "wgp.py's own output is passed through"
    assert "Keyboard interruption in main thread... closing server." in output, "SIGINT: clean"


async def test_a_stop_while_loading_stops_wgp(launch: Any, tmp_path: Path) -> None:
    run = await launch(EAGER_LOAD_MODEL="1", WAN2GP_CHECKPOINTS=models(tmp_path, T2V))
    await run.until(lambda s, b: b["stage"] == "loading")
    wgp_pid = int((run.cwd / "wgp.pid").read_text())
    run.proc.send_signal(signal.SIGTERM)
    assert await run.exit_code() == 0
    assert not pid_alive(wgp_pid)
    assert "KeyboardInterrupt" in run.output(), "SIGINT reached wgp.py mid-load"


async def test_two_files_are_reported_while_they_load(launch: Any, tmp_path: Path) -> None:
    names = [f"wan2.2_image2video_14B_{f}_quanto_mbf16_int8.safetensors" for f in ("high", "low")]
    share = models(tmp_path, *names)
    run = await launch(EAGER_LOAD_MODEL="1", WAN2GP_MODEL="i2v_2_2", WAN2GP_CHECKPOINTS=share)
    body = await run.until(lambda s, b: len(b.get("loading", [])) == 2)
    assert body["loading"] == names
    assert body["message"] == f"loading {names[1]} (file 2)"
    run.release_load()
    assert (await run.until(lambda s, b: s == 200))["loaded"] == names


@pytest.mark.parametrize("flag", [None, "0"])
async def test_without_eager_load_ready_once_the_app_answers(
    launch: Any, tmp_path: Path, flag: str | None
) -> None:
    run = await launch(**({} if flag is None else {"EAGER_LOAD_MODEL": flag}))
    body = await run.until(lambda s, b: s == 200)
    assert body == {"stage": "ready", "progress": 1.0, "loaded": [], "eager": False}
    assert run.config()["preload_model_policy"] == [], "nothing preloaded"
    assert "Loading Model" not in run.output()


async def test_ready_only_once_gradios_own_launch_check_is_over(launch: Any) -> None:
    """Gradio's launch() checks ``HEAD /`` with a 3 s timeout after the app first answers and
    exits when that times out: a burst of page loads let through meanwhile killed Wan2GP. The
    app answering is ``launching``; ``ready`` comes once the check is over."""
    run = await launch("--launch-check", "60")
    body = await run.until(lambda s, b: b.get("stage") == "launching")
    assert "progress" not in body
    assert body["message"] == "the app answers; Gradio's launch check runs"
    assert "its launch check runs" in run.output()
    status, body = await run.readyz() or (0, {})
    assert (status, body["stage"]) == (503, "launching"), "not ready while it may still check"


async def test_eager_load_0_after_a_run_with_1_preloads_nothing(
    launch: Any, tmp_path: Path
) -> None:
    share = models(tmp_path, T2V)
    first = await launch(EAGER_LOAD_MODEL="1", WAN2GP_CHECKPOINTS=share)
    await first.until(lambda s, b: b["stage"] == "loading")
    first.release_load()
    await first.until(lambda s, b: s == 200)
    first.proc.send_signal(signal.SIGTERM)
    assert await first.exit_code() == 0
    (tmp_path / "release-load").unlink()

    second = await launch(EAGER_LOAD_MODEL="0", WAN2GP_CHECKPOINTS=share)
    body = await second.until(lambda s, b: s == 200)
    assert body == {"stage": "ready", "progress": 1.0, "loaded": [], "eager": False}
    assert second.config()["preload_model_policy"] == [], "0 takes out the P the first run put"
    assert "Loading Model" not in second.output(), "(the log is the second run's alone)"
    assert all(not b["eager"] for _, b in second.seen)


async def test_eager_load_unset_reports_the_preload_the_file_asks_for(
    launch: Any, tmp_path: Path
) -> None:
    (tmp_path / "wgp_config.json").write_text(json.dumps({"preload_model_policy": ["P"]}))
    run = await launch(WAN2GP_CHECKPOINTS=models(tmp_path, T2V))
    body = await run.until(lambda s, b: b["stage"] == "loading")
    assert body["eager"] is True, "wgp.py preloads, as its file says: /readyz says so"
    run.release_load()
    assert (await run.until(lambda s, b: s == 200))["eager"] is True


async def test_a_failed_preload_says_failed_with_the_missing_file_until_sigterm(
    launch: Any, tmp_path: Path
) -> None:
    empty = models(tmp_path)  # the share lacks the model's weights
    run = await launch(EAGER_LOAD_MODEL="1", WAN2GP_MODEL="t2v", WAN2GP_CHECKPOINTS=empty)
    await run.until(lambda s, b: b["stage"] == "loading")
    run.release_load()
    body = await run.until(lambda s, b: b["stage"] == "failed")
    assert run.seen[-1][0] == 503
    assert body["error"].startswith(
        f"wgp.py exited with code 1 (loading): Exception: Unable to locate file '{T2V}'"
    ), body
    assert await run.readyz() == (503, body), "still said, the listener kept open"
    assert run.proc.returncode is None
    assert all(status == 503 for status, _ in run.seen)

    run.proc.send_signal(signal.SIGTERM)
    assert await run.exit_code() == 1, "the start failed: wgp.py's code, also when stopped"
    output = run.output()
    assert "warmgate-wan2gp: wgp.py exited with code 1 (loading); its last lines:" in output
    assert f"warmgate-wan2gp:   Exception: Unable to locate file '{T2V}'" in output


async def test_a_failure_is_said_for_failed_linger_then_the_launcher_exits(
    launch: Any, tmp_path: Path
) -> None:
    run = await launch(
        "--failed-linger", "0.5", EAGER_LOAD_MODEL="1", WAN2GP_CHECKPOINTS=models(tmp_path)
    )
    await run.until(lambda s, b: b["stage"] == "loading")
    run.release_load()
    await run.until(lambda s, b: b["stage"] == "failed")
    assert await run.exit_code() == 1


async def test_a_death_in_gradios_launch_check_exits_at_once_with_the_exception_last(
    launch: Any,
) -> None:
    """After its app answered, wgp.py died in Gradio's own launch check (``HEAD /`` timed out on
    a loaded host): no linger (a new start may pass it), the exception as the last line."""
    run = await launch("--launch-check", "60", STANDIN_LAUNCH_CHECK_DIES="always")
    await run.until(lambda s, b: b["stage"] == "launching")
    assert await run.exit_code() == 1
    last = run.output().rstrip().splitlines()[-1]
    assert last.startswith("ValueError: When localhost is not accessible"), last


async def test_a_download_refused_offline_is_said_in_its_own_words(
    launch: Any, tmp_path: Path
) -> None:
    run = await launch(
        EAGER_LOAD_MODEL="1",
        WAN2GP_CHECKPOINTS=models(tmp_path),
        HF_HUB_OFFLINE="1",
        STANDIN_DOWNLOAD="1",
    )
    body = await run.until(lambda s, b: b["stage"] == "failed")
    error = body["error"]
    assert "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested" in error
    assert f"a weight file is in none of {[str(tmp_path / 'models/wan2gp')]}" in error
    assert "HF_HUB_OFFLINE" in error and "Traceback" not in error


async def test_an_existing_config_keeps_its_settings(launch: Any, tmp_path: Path) -> None:
    mine = {"attention_mode": "sage2", "profile": 3, "preload_model_policy": ["U", "S"]}
    (tmp_path / "wgp_config.json").write_text(json.dumps(mine))
    run = await launch(EAGER_LOAD_MODEL="1", WAN2GP_CHECKPOINTS=models(tmp_path, T2V))
    await run.until(lambda s, b: b["stage"] == "loading")
    config = run.config()
    assert config["preload_model_policy"] == ["P", "S"], "U would unload after each queue"
    assert (config["attention_mode"], config["profile"]) == ("sage2", 3)
    assert "last_model_type" not in config, "wgp.py's own default model"
    run.release_load()
    await run.until(lambda s, b: s == 200)


async def test_a_setting_it_cannot_honour_starts_nothing(launch: Any, tmp_path: Path) -> None:
    run = await launch(EAGER_LOAD_MODEL="maybe")
    assert await run.exit_code() == 2
    assert "EAGER_LOAD_MODEL='maybe': expected 1 or 0" in run.output()
    assert not (tmp_path / "wgp.pid").exists()


# -- the pure parts -----------------------------------------------------------------------------


def test_loading_lines_as_wan2gp_prints_them() -> None:
    state = readiness.Readiness(eager=True)
    for line in [
        "stand-in wgp.py: model t2v",
        "Loading Model 'a.safetensors' ...",
        "Loading Module 'b.safetensors' ...",
        "  Loading Text Encoder 'c.safetensors' ...",
        "Loading Model 'not a line of Wan2GP's",
    ]:
        state = readiness.observe_line(state, line)
    assert state.files == ("a.safetensors", "b.safetensors", "c.safetensors")
    launching = readiness.app_answered(state)
    assert launching.stage == "launching" and readiness.answer(launching)[0] == 503
    ready = readiness.launched(launching)
    assert ready.stage == "ready" and readiness.answer(ready)[0] == 200
    assert readiness.observe_line(ready, "Loading Model 'd.safetensors' ...") == ready
    assert readiness.exited(readiness.stopping(ready), 0).stage == "stopping"


def test_the_line_that_says_why_wgp_failed() -> None:
    traceback = [
        "stand-in wgp.py: model t2v",
        "Traceback (most recent call last):",
        '  File "wgp.py", line 9, in <module>',
        "    raise Exception(f'Unable to locate file {name}')",
        "Exception: Unable to locate file 'a.safetensors', tried ['/m/a.safetensors']",
        "[W1202 rank0] a warning printed at exit",
    ]
    assert readiness.failure_line(traceback) == traceback[4]
    assert readiness.failure_line(["  oops", "last words", ""]) == "last words"
    assert readiness.failure_line([]) is None
    state = readiness.exited(readiness.Readiness(eager=True), 1, traceback[4])
    assert state.error == f"wgp.py exited with code 1 (starting): {traceback[4]}"


def test_output_lines_split_on_newlines_and_progress_redraws() -> None:
    lines = readiness.Lines(limit=8)
    assert lines.feed(b"one\ntw") == ["one"]
    assert lines.feed(b"o\r 50%\r100%\n") == ["two", " 50%", "100%"]
    assert lines.feed(b"a-very-long-line") == []
    assert lines.close() == ["ong-line"]


def test_the_app_port_as_wgp_decides_it() -> None:
    assert readiness.app_port(["python", "wgp.py", "--server-port", "7870"], {}) == 7870
    assert readiness.app_port(["wgp.py", "--server-port=7871"], {}) == 7871
    assert readiness.app_port(["wgp.py", "--server-port", "0"], {"SERVER_PORT": "7872"}) == 7872
    assert readiness.app_port(["wgp.py", "--listen"], {}) == 7860


def test_http_heads() -> None:
    assert readiness.request_path(b"GET /readyz?x=1 HTTP/1.1\r\nHost: a\r\n\r\n") == (
        "GET",
        "/readyz",
    )
    assert readiness.request_path(b"\x16\x03\x01 tls") is None
    assert readiness.response_status(b"HTTP/1.1 200 OK\r\n") == 200
    assert readiness.response_status(b"SSH-2.0-OpenSSH\r\n") is None


def test_settings_and_merge() -> None:
    settings = wgpconfig.settings_from(
        {"EAGER_LOAD_MODEL": "true", "WAN2GP_CHECKPOINTS": "/models/wan2gp, ckpts,"}
    )
    assert settings == wgpconfig.Settings(True, None, ("/models/wan2gp", "ckpts"))
    assert wgpconfig.merged({}, settings)["preload_model_policy"] == ["P"]
    unset = wgpconfig.settings_from({})
    assert unset.eager is None
    assert wgpconfig.merged({"preload_model_policy": ["P"]}, unset) == {
        "preload_model_policy": ["P"]
    }
    off = wgpconfig.settings_from({"EAGER_LOAD_MODEL": "0"})
    assert wgpconfig.merged({"preload_model_policy": ["P", "S"]}, off) == {
        "preload_model_policy": ["S"]
    }
    assert wgpconfig.preloads({"preload_model_policy": ["S", "P"]})
    assert not wgpconfig.preloads({})
    with pytest.raises(wgpconfig.SettingsError):
        wgpconfig.settings_from({"EAGER_LOAD_MODEL": "2"})
