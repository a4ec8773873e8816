"""Scale from zero on one machine, with real child processes behind a real warmgate."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from backends.outside import ERROR_CHARS
from backends.process import MAX_LINE, OutputLines, exit_reason
from router.scale.state import Phase
from tests.helpers import ROOT, Subprocess, metric_value, wait_until, warmgate

SLEEPY = ["python", "-m", "tests.sleepy_engine", "--port", "{port}"]


def process_config(
    command: list[str] | None = None, *, load: float = 0.5, **scaling: Any
) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {
            "t": {
                "routes": [{"path_prefix": "/"}],
                "backend": {
                    "kind": "process",
                    "command": command or [*SLEEPY, "--load", str(load)],
                    "cwd": str(ROOT),
                    "stop_grace": "5s",
                },
                "readiness": {"path": "/readyz", "interval": "50ms"},
                "scaling": {"idle_after": "30m", "cold_start_timeout": "60s", **scaling},
            }
        },
    }


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def child_pids(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


async def test_a_thousand_requests_during_one_cold_start_are_all_answered() -> None:
    # A load long enough that all 1000 are held before it ends, however slowly they connect.
    async with warmgate(process_config(load=3.0)) as wg:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as client:

            async def one(i: int) -> tuple[int, str | None]:
                async with client.get(f"{wg.url}/item/{i}") as resp:
                    await resp.read()
                    return resp.status, resp.headers.get("X-Warmgate-Cold-Start")

            results = await asyncio.gather(*(one(i) for i in range(1000)))
        assert [status for status, _ in results] == [200] * 1000
        waits = [float(w) for _, w in results if w is not None]
        assert len(waits) == 1000, "every response says how long it waited"
        assert min(waits) >= 0.5
        assert await metric_value(wg.admin, "warmgate_cold_starts_total") == 1
        assert await metric_value(wg.admin, "warmgate_hold_outcomes_total", outcome="ready") == 1000


async def test_idle_release_stops_the_child_and_the_next_request_wakes_it() -> None:
    async with warmgate(process_config(idle_after="1s")) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/") as resp:
            first_pid = (await resp.text()).split()[-1]
            assert resp.headers.get("X-Warmgate-Cold-Start")
        runtime = wg.runtime()
        await wait_until(lambda: runtime.state.phase is Phase.COLD, timeout=15)
        assert not alive(int(first_pid))
        async with client.get(wg.url + "/") as resp:
            assert resp.status == 200
            assert (await resp.text()).split()[-1] != first_pid
        assert await metric_value(wg.admin, "warmgate_idle_releases_total") == 1
        assert await metric_value(wg.admin, "warmgate_cold_start_seconds_count") == 2
        assert await metric_value(wg.admin, "warmgate_gpu_seconds_total", state="idle") > 0


async def test_a_crash_while_ready_fails_in_flight_requests_then_wakes_again() -> None:
    async with warmgate(process_config()) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/") as resp:
            assert resp.status == 200
        slow = asyncio.ensure_future(client.get(wg.url + "/slow?s=30"))
        runtime = wg.runtime()
        await wait_until(lambda: runtime.activity.in_flight == 1)  # forwarded, not held
        async with client.get(wg.url + "/crash") as resp:
            assert resp.status == 502
        response = await slow
        assert response.status == 502
        await wait_until(lambda: runtime.state.phase is Phase.COLD)
        async with client.get(wg.url + "/") as resp:
            assert resp.status == 200
            assert resp.headers.get("X-Warmgate-Cold-Start")


async def test_a_command_that_cannot_start_fails_with_503_and_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = process_config(["/nonexistent/engine", "--port", "{port}"], failure_backoff="30s")
    async with warmgate(config) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/", headers={"Accept": "application/json"}) as resp:
            assert resp.status == 503
            body = await resp.json()
            assert resp.headers["Retry-After"]
        assert body["error"]["code"] == "target_failed"
        assert "nonexistent" not in body["error"]["message"]
        assert "No such file" in caplog.text
        assert wg.runtime().state.phase is Phase.FAILED


async def test_a_crash_loop_goes_to_failed_with_the_stderr_tail_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    crash = [
        "python",
        "-c",
        "import sys; print('CUDA out of memory', file=sys.stderr); sys.exit(3)",
    ]
    config = process_config(crash, failure_backoff="100ms", failure_backoff_max="200ms")
    async with warmgate(config) as wg, aiohttp.ClientSession() as client:
        for _ in range(3):
            async with client.get(wg.url + "/") as resp:
                assert resp.status == 503
                assert "CUDA" not in await resp.text()
            await asyncio.sleep(0.25)
        assert "exited with code 3" in caplog.text and "CUDA out of memory" in caplog.text
        assert wg.runtime().state.failures >= 3


async def test_a_child_that_raises_during_its_start_says_why_on_the_waiting_page() -> None:
    """ComfyUI run on an interpreter without torch: the reason is the traceback's exception
    line, not only the exit code (the waiting page and the status JSON show it)."""
    raises = ["python", "-c", "print('loading'); import torch_that_is_not_here"]
    config = process_config(raises, failure_backoff="30s")
    async with warmgate(config) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/", headers={"Accept": "application/json"}) as resp:
            assert resp.status == 503
        async with client.get(wg.url + "/.warmgate/status/t") as resp:
            status = await resp.json()
        assert status["failure"] == (
            "exited with code 1: ModuleNotFoundError: No module named 'torch_that_is_not_here'"
        )
        page_headers = {"Accept": "text/html", "Sec-Fetch-Mode": "navigate"}
        async with client.get(wg.url + "/", headers=page_headers) as resp:
            assert "No module named" in await resp.text()


def test_an_exit_reason_is_one_bounded_line_of_the_childs_last_words() -> None:
    assert exit_reason(3, []) == "exited with code 3"
    assert exit_reason(1, ["fatal: no GPU", "  "]) == "exited with code 1: fatal: no GPU"
    traceback = ["Traceback (most recent call last):", '  File "main.py"', "ValueError: bad", "x"]
    assert exit_reason(1, traceback) == "exited with code 1: ValueError: bad"
    long = exit_reason(1, ["\x1b[31m" + "e" * 1000])
    assert len(long) == ERROR_CHARS and "\x1b" not in long


async def test_racing_the_idle_release_loses_nothing() -> None:
    """Requests keep arriving around the idle deadline: some cancel a drain, some land after the
    stop and wait for the next start. Every one is answered 200."""
    async with warmgate(process_config(idle_after="300ms", load=0.1)) as wg:
        async with aiohttp.ClientSession() as client:
            statuses = []
            for i in range(40):
                async with client.get(f"{wg.url}/r/{i}") as resp:
                    statuses.append(resp.status)
                await asyncio.sleep(0.1 + (i % 7) * 0.05)
        assert statuses == [200] * 40
        assert await metric_value(wg.admin, "warmgate_idle_releases_total") >= 2


async def test_an_idle_tab_reconnecting_its_websocket_neither_keeps_nor_wakes_the_target() -> None:
    async with warmgate(process_config(idle_after="2s", load=0.1)) as wg:
        runtime = wg.runtime()
        async with aiohttp.ClientSession() as client:
            async with client.get(wg.url + "/page", headers={"Accept": "text/plain"}) as resp:
                assert resp.status == 200
            refused = closed_by_release = 0
            loop = asyncio.get_running_loop()
            end = loop.time() + 6  # two idle windows and more
            while loop.time() < end:
                try:
                    async with client.ws_connect(wg.url + "/ws") as ws:
                        msg = await ws.receive(timeout=3)  # a silent tab, past idle_after
                        if msg.type is aiohttp.WSMsgType.CLOSE and ws.close_code == 1001:
                            closed_by_release += 1
                except aiohttp.WSServerHandshakeError as exc:
                    assert exc.status == 503
                    refused += 1
                    await asyncio.sleep(2)
                except TimeoutError:
                    pass
        await wait_until(lambda: runtime.state.phase is Phase.COLD)
        assert closed_by_release == 1, "the release closed the silent tab with 1001"
        assert refused >= 1, "reconnects to the cold target were refused, not woken"
        assert await metric_value(wg.admin, "warmgate_cold_starts_total") == 1


async def test_waiting_page_for_browsers_api_clients_are_held() -> None:
    async with warmgate(process_config(load=1.0)) as wg, aiohttp.ClientSession() as client:
        page_headers = {"Accept": "text/html,application/xhtml+xml", "Sec-Fetch-Mode": "navigate"}
        async with client.get(wg.url + "/page", headers=page_headers) as resp:
            assert resp.status == 503
            assert resp.headers["Cache-Control"] == "no-store"
            assert int(resp.headers["Retry-After"]) >= 1
            page = await resp.text()
        assert "Starting <b>t</b>" in page and 'http-equiv="refresh"' in page
        assert "/.warmgate/status/" in page
        async with client.get(wg.url + "/.warmgate/status/t") as resp:
            status = await resp.json()
        assert status["phase"] in ("starting", "cold") and status["ready"] is False
        async with client.get(wg.url + "/", headers={"Accept": "application/json"}) as resp:
            assert resp.status == 200  # held, then served
        async with client.get(wg.url + "/.warmgate/status/t") as resp:
            assert (await resp.json())["ready"] is True
        async with client.get(wg.url + "/page", headers=page_headers) as resp:
            assert resp.status == 200 and "engine page" in await resp.text()
        async with client.get(wg.url + "/.warmgate/other") as resp:
            assert resp.status == 404


def test_no_child_survives_warmgate(tmp_path: Path) -> None:
    """SIGTERM stops the child cleanly; SIGKILL of warmgate kills it via the parent-death signal."""
    for how in (signal.SIGTERM, signal.SIGKILL):
        wg = Subprocess(process_config(), tmp_path).start()
        try:
            import urllib.request

            with urllib.request.urlopen(wg.url + "/", timeout=30) as resp:
                engine_pid = int(resp.read().decode().split()[-1])
            assert engine_pid in child_pids(wg.pid)
            os.kill(wg.pid, how)
            assert wg.proc is not None
            wg.proc.wait(30)
            deadline = psutil.time.monotonic() + 10
            while alive(engine_pid) and psutil.time.monotonic() < deadline:
                psutil.time.sleep(0.05)
            assert not alive(engine_pid), f"engine survived {how.name} of warmgate"
        finally:
            wg.stop()


# A child that writes 1 MiB without a newline (tqdm's "\r" progress while it downloads weights),
# then serves: its output keeps draining, so it never blocks on a full pipe.
LONG_LINE_THEN_SERVE = [
    "python",
    "-c",
    "import runpy, sys\n"
    "sys.stdout.write('#' * (1 << 20)); sys.stdout.flush()\n"
    "for i in range(2000): sys.stderr.write('\\rDownloading %.1f%%' % (i / 20))\n"
    "sys.stderr.flush()\n"
    "sys.argv = ['sleepy', '--port', '{port}', '--load', '0.1']\n"
    "runpy.run_module('tests.sleepy_engine', run_name='__main__')\n",
]


async def test_a_child_writing_a_mebibyte_without_a_newline_still_becomes_ready(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = process_config(LONG_LINE_THEN_SERVE, cold_start_timeout="20s")
    caplog.set_level("INFO", logger="warmgate.process")
    async with (
        warmgate(config) as wg,
        aiohttp.ClientSession() as client,
        client.get(f"{wg.url}/item/1") as resp,
    ):
        assert resp.status == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "warmgate.process"]
    hashes = [line for line in lines if "####" in line]
    assert hashes, "the long line reached the log, cut into pieces"
    assert all(len(line) <= 8 * 1024 + 64 for line in hashes)
    assert sum(line.count("#") for line in hashes) == 1 << 20, "nothing of it was lost"
    assert any("Downloading 99.9%" in line for line in lines), "\\r ends a line too"


def test_output_lines_end_at_cr_and_lf_and_are_cut_on_character_boundaries() -> None:
    lines = OutputLines()
    assert lines.feed(b"10%\r20%\r") == ["10%", "20%"]
    assert lines.feed(b"a\r\nb\n\n") == ["a", "b"]
    assert lines.feed(b"partial") == []
    assert lines.feed(b" line\n") == ["partial line"]
    long = "é" * MAX_LINE  # two bytes each: a cut at MAX_LINE bytes would split one
    pieces = lines.feed(long.encode())
    assert pieces and all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces + lines.flush()) == long
    assert lines.flush() == []


async def test_a_child_that_exits_by_itself_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="warmgate.process")
    async with warmgate(process_config()) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/") as resp:
            assert resp.status == 200
        pid = wg.runtime().backend.pid
        async with client.get(wg.url + "/crash") as resp:
            assert resp.status == 502
        await wait_until(lambda: wg.runtime().state.phase is Phase.COLD)
    exits = [
        r.getMessage()
        for r in caplog.records
        if r.name == "warmgate.process" and "exit" in r.getMessage()
    ]
    assert len(exits) == 1, exits
    assert pid is not None


# A launcher in the form of the Wan2GP image's (``python -m launcher -- python app.py ...``): it
# says which program it runs after ``--``, then becomes it.
LAUNCHER_THEN_PYTHON = [
    "python",
    "-c",
    "import os, sys\n"
    "argv = sys.argv[sys.argv.index('--') + 1 :]\n"
    "print('launching', argv[0], flush=True)\n"
    "os.execvp(argv[0], argv)\n",
    "--",
    "python",
    "-m",
    "tests.sleepy_engine",
    "--port",
    "{port}",
    "--load",
    "0.1",
]


async def test_python_after_a_launchers_double_dash_is_warmgates_interpreter_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="warmgate.process")
    async with (
        warmgate(process_config(LAUNCHER_THEN_PYTHON)) as wg,
        aiohttp.ClientSession() as client,
        client.get(f"{wg.url}/item/1") as resp,
    ):
        assert resp.status == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "warmgate.process"]
    assert f"[t] launching {sys.executable}" in lines, lines


LAUNCHER = (
    "import socket, sys, time\n"
    "ready = socket.create_server(('127.0.0.1', int(sys.argv[1])))\n"
    "time.sleep(3600)  # its engine opens its own port only once the model is loaded\n"
)
"""A launcher like Wan2GP's: it listens on ``{ready_port}`` at once, its engine's port last."""


async def test_a_child_that_listens_on_its_ready_port_is_loading() -> None:
    data = process_config(["python", "-c", LAUNCHER, "{ready_port}", "--port", "{port}"])
    data["targets"]["t"]["readiness"] = {"path": "/readyz", "port": "{ready_port}"}
    async with warmgate(data) as wg:
        runtime = wg.runtime("t")
        runtime.request_start()
        await wait_until(lambda: runtime.state.stage == "loading")
        assert runtime.state.phase is Phase.STARTING


LAUNCH_CHECK_DIES = (
    "import pathlib, socket, sys, time\n"
    "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
    "port, once, log = int(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])\n"
    "with log.open('a') as f: f.write('start\\n')\n"
    "if once == 'always' or not pathlib.Path(once).exists():\n"
    "    pathlib.Path(once).touch()\n"
    "    listening = socket.create_server(('127.0.0.1', port))\n"
    "    time.sleep(0.2)  # Gradio's own launch check: HEAD / times out on a loaded host\n"
    "    print('Traceback (most recent call last):', file=sys.stderr)\n"
    "    print('  File \"gradio/blocks.py\", line 2570, in launch', file=sys.stderr)\n"
    "    print('ValueError: When localhost is not accessible, a shareable link must be created.',"
    " file=sys.stderr)\n"
    "    print('shutting down', file=sys.stderr)\n"
    "    sys.exit(1)\n"
    "class Ready(BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
    "        self.wfile.write(b'ok')\n"
    "HTTPServer(('127.0.0.1', port), Ready).serve_forever()\n"
)
"""An app that dies in its own launch check while the file ``once`` is not there yet (it makes
it first; ``always``: it dies every time), then starts; each start is a line of ``log``."""

JSON = {"Accept": "application/json"}


async def test_a_start_that_dies_in_its_launch_check_once_is_tried_again_for_held_requests(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    command = ["python", "-c", LAUNCH_CHECK_DIES, "{port}", str(tmp_path / "once"), str(runs)]
    config = process_config(command, failure_backoff="10m")
    async with warmgate(config) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/", headers=JSON) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers.get("X-Warmgate-Cold-Start")
        assert runs.read_text().count("start") == 2
        assert wg.runtime().state.failures == 0
        assert await metric_value(wg.admin, "warmgate_cold_starts_total", target="t") == 1


async def test_a_start_that_always_dies_fails_with_its_exception_after_the_retries(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    command = ["python", "-c", LAUNCH_CHECK_DIES, "{port}", "always", str(runs)]
    config = process_config(command, failure_backoff="10m", start_retries=2)
    config["targets"]["t"]["backend"]["cwd"] = str(tmp_path)
    async with warmgate(config) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/", headers=JSON) as resp:
            assert resp.status == 503
            error = (await resp.json())["error"]
        said = "ValueError: When localhost is not accessible, a shareable link must be created."
        assert error["code"] == "target_failed" and said in error["message"], error
        assert runs.read_text().count("start") == 3  # the first try and two more
        state = wg.runtime().state
        assert state.phase is Phase.FAILED and said in state.reason
        assert "exited with code 1" in state.reason


# A launcher like Wan2GP's: on SIGTERM it sends its engine SIGINT and waits for it, so the
# engine's exit handlers run (Wan2GP's autosave of its queue is one).
SIGINT_LAUNCHER = (
    "import signal, subprocess, sys\n"
    "engine = subprocess.Popen([sys.executable, '-c', sys.argv[1], *sys.argv[2:]])\n"
    "signal.signal(signal.SIGTERM, lambda *_: engine.send_signal(signal.SIGINT))\n"
    "sys.exit(engine.wait())\n"
)
ENGINE_WITH_ATEXIT = (
    "import atexit, pathlib, signal, sys\n"
    "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
    "if sys.argv[3] == 'deaf': signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "atexit.register(lambda: pathlib.Path(sys.argv[2]).write_text('queue saved'))\n"
    "class Ready(BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
    "        self.wfile.write(b'ok')\n"
    "pathlib.Path(sys.argv[2] + '.pid').write_text(str(__import__('os').getpid()))\n"
    "HTTPServer(('127.0.0.1', int(sys.argv[1])), Ready).serve_forever()\n"
)


async def _launch_and_stop(tmp_path: Path, engine: str, stop_grace: str) -> Path:
    """The launcher and its engine (``hears`` or ``deaf`` to SIGINT) started by a request,
    then stopped; asserts the engine is gone, and returns where its exit handler saves."""
    saved, pid_file = tmp_path / "autosave", tmp_path / "autosave.pid"
    launcher = ["python", "-c", SIGINT_LAUNCHER, ENGINE_WITH_ATEXIT, "{port}", str(saved), engine]
    config = process_config(launcher)
    config["targets"]["t"]["backend"]["stop_grace"] = stop_grace
    async with warmgate(config) as wg, aiohttp.ClientSession() as client:
        async with client.get(wg.url + "/") as resp:
            assert resp.status == 200
        engine_pid = int(pid_file.read_text())
        await wg.runtime().backend.scale_down()
        assert not alive(engine_pid)
    return saved


@pytest.mark.parametrize("engine", ["hears", "deaf"])
async def test_a_launcher_stops_its_engine_its_own_way_before_the_group_is_killed(
    tmp_path: Path, engine: str
) -> None:
    # long enough for an engine that hears its launcher to save and exit on a loaded machine
    # (it exits as soon as it has); one that is deaf is killed when the grace is spent
    saved = await _launch_and_stop(tmp_path, engine, "10s" if engine == "hears" else "1s")
    if engine == "hears":  # SIGINT from its launcher: its exit handlers ran
        assert saved.read_text() == "queue saved"
    else:  # it ignores SIGINT: killed with its group once stop_grace is spent
        assert not saved.exists()


async def test_an_engine_hears_its_launcher_when_warmgate_was_started_ignoring_sigint(
    tmp_path: Path,
) -> None:
    """A shell starts a background command with SIGINT ignored, and an ignored signal stays
    ignored across exec: warmgate's children hear it again, so the launcher's SIGINT still
    lets its engine save."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        saved = await _launch_and_stop(tmp_path, "hears", "10s")
    finally:
        signal.signal(signal.SIGINT, before)
    assert saved.read_text() == "queue saved"
