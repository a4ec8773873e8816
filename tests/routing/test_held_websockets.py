"""Open tabs stay calm (``waiting.hold_websockets``, comfyui by default): a tab's websocket to a
target that is not ready is accepted and held open silently, wakes nothing, and is bridged to
the engine (same path, same ``clientId``) once a real action made the target ready; a release
holds it again instead of closing it; it counts in ``max_held``; warmgate's shutdown closes it
with 1001. The demo engine (ComfyUI's API) runs as a real child process behind a real warmgate."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.config import parse_config
from router.errors import ConfigError
from router.scale.state import Phase, TargetState
from tests.helpers import ROOT, Running, metric_value, wait_until, warmgate
from tests.scale.test_parked import graph


def config(tmp: Path, *, render: float = 1.0, **scaling: Any) -> dict[str, Any]:
    command = [
        "python", "-m", "backends.demo_engine", "--port", "{port}",
        "--checkpoint", str(tmp / "checkpoint.bin"), "--checkpoint-size", "1MiB",
        "--render-seconds", str(render), "--steps", "4",
    ]  # fmt: skip
    target = {
        "engine": "comfyui",
        "routes": [{"path_prefix": "/comfy", "strip_prefix": True}],
        "backend": {"kind": "process", "command": command, "cwd": str(ROOT), "stop_grace": "5s"},
        "readiness": {"path": "/readyz", "interval": "50ms"},
        "scaling": {"idle_after": "10m", "busy_poll": "200ms", **scaling},
        "waiting_page": "off",
    }
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {"comfy": target},
    }


def ws_url(wg: Running, client_id: str) -> str:
    return wg.url.replace("http", "ws", 1) + f"/comfy/ws?clientId={client_id}"


def phases_of(wg: Running) -> list[TargetState]:
    seen: list[TargetState] = []
    wg.runtime("comfy").cell.subscribe(lambda old, new: seen.append(new))
    return seen


async def render(client: aiohttp.ClientSession, wg: Running, client_id: str) -> str:
    body = {"prompt": graph(), "client_id": client_id}
    async with client.post(wg.url + "/comfy/prompt", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return str((await resp.json())["prompt_id"])


async def messages_of(ws: aiohttp.ClientWebSocketResponse, prompt_id: str) -> list[str]:
    """The kinds of the JSON messages the socket carries for ``prompt_id``, to its success."""
    kinds: list[str] = []
    while "execution_success" not in kinds:
        msg = await ws.receive(timeout=30)
        assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), msg
        if msg.type is aiohttp.WSMsgType.TEXT:
            data = json.loads(msg.data)
            if data.get("data", {}).get("prompt_id") == prompt_id:
                kinds.append(data["type"])
    return kinds


async def read_what_came(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Read the messages the engine sent before now (its status after a render); never a
    close."""
    while True:
        try:
            msg = await ws.receive(timeout=0.3)
        except TimeoutError:
            return
        assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), msg


async def nothing_comes(ws: aiohttp.ClientWebSocketResponse, seconds: float) -> None:
    """The socket stays open and silent for ``seconds``."""
    with pytest.raises(TimeoutError):
        msg = await ws.receive(timeout=seconds)
        raise AssertionError(f"the held socket said {msg}")
    assert not ws.closed


async def test_a_held_tab_wakes_nothing_and_gets_its_progress_once_a_prompt_woke_the_engine(
    tmp_path: Path,
) -> None:
    async with aiohttp.ClientSession() as client:
        async with warmgate(config(tmp_path)) as wg:
            comfy = wg.runtime("comfy")
            seen = phases_of(wg)
            ws = await client.ws_connect(ws_url(wg, "tab"))
            assert comfy.activity.held_sockets == 1
            assert await metric_value(wg.admin, "warmgate_websockets_held", target="comfy") == 1
            async with client.get(wg.admin + "/targets") as resp:
                assert (await resp.json())["comfy"]["held_websockets"] == 1
            await nothing_comes(ws, 1.5)
            assert seen == [] and comfy.state.phase is Phase.COLD, "a held tab woke the target"
            assert not comfy.backend.observe().running
            assert (comfy.activity.held, comfy.activity.in_flight) == (0, 0)

            prompt_id = await render(client, wg, "tab")  # a real action wakes it
            kinds = await messages_of(ws, prompt_id)
            assert "progress" in kinds
            assert comfy.activity.held_sockets == 0
            assert await metric_value(wg.admin, "warmgate_websockets_open", target="comfy") == 1
            await read_what_came(ws)
        # warmgate's shutdown closes the bridged tab's socket with 1001
        closed = await ws.receive(timeout=10)
        assert (closed.type, closed.data) == (aiohttp.WSMsgType.CLOSE, 1001)
        await ws.close()


async def test_a_release_holds_the_tab_again_and_the_next_start_bridges_it(
    tmp_path: Path,
) -> None:
    data = config(tmp_path, idle_after="1s", stream_activity_window="200ms")
    async with warmgate(data) as wg, aiohttp.ClientSession() as client:
        comfy = wg.runtime("comfy")
        async with client.ws_connect(ws_url(wg, "tab")) as ws:
            first = await render(client, wg, "tab")
            assert "progress" in await messages_of(ws, first)
            pid = comfy.backend.observe().endpoints
            # Idle: released although the tab's socket is open (it is not activity); the tab
            # sees no close, and its socket is held again.
            await wait_until(lambda: comfy.state.phase is Phase.COLD, timeout=20)
            await wait_until(lambda: comfy.activity.held_sockets == 1, timeout=5)
            await read_what_came(ws)
            await nothing_comes(ws, 2.0)
            assert comfy.state.phase is Phase.COLD, "the held tab woke it"

            second = await render(client, wg, "tab")  # a new process, a new port
            assert comfy.backend.observe().endpoints != pid
            assert "progress" in await messages_of(ws, second)
            await ws.send_str('{"type": "still here"}')


async def test_a_parked_target_keeps_its_tab_and_a_new_one_is_held_without_a_wake(
    tmp_path: Path,
) -> None:
    data = config(tmp_path, park_after="1s", stream_activity_window="200ms")
    async with warmgate(data) as wg, aiohttp.ClientSession() as client:
        comfy = wg.runtime("comfy")
        async with client.ws_connect(ws_url(wg, "a")) as bridged:
            first = await render(client, wg, "a")
            assert "progress" in await messages_of(bridged, first)

            def parked() -> bool:
                state = comfy.state
                return state.phase is Phase.PARKED and not state.parking

            await wait_until(parked, timeout=20)
            await read_what_came(bridged)
            assert not bridged.closed
            async with client.ws_connect(ws_url(wg, "b")) as held:
                await nothing_comes(held, 1.5)
                assert parked() and not comfy.state.waking, "the held tab woke it"
                second = await render(client, wg, "b")  # wakes it
                assert "progress" in await messages_of(held, second)


async def test_held_websockets_count_in_max_held_and_go_with_1001_at_shutdown(
    tmp_path: Path,
) -> None:
    data = config(tmp_path, max_held=1)
    async with aiohttp.ClientSession() as client:
        async with warmgate(data) as wg:
            held = await client.ws_connect(ws_url(wg, "one"))
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(ws_url(wg, "two"))
            assert refused.value.status == 503
            async with client.post(wg.url + "/comfy/prompt", json={"prompt": graph()}) as resp:
                assert resp.status == 503 and (await resp.json())["error"]["code"] == "overloaded"
        closed = await held.receive(timeout=10)
        assert (closed.type, closed.data) == (aiohttp.WSMsgType.CLOSE, 1001)
        assert closed.extra == "warmgate is shutting down"
        await held.close()


async def test_an_engine_that_does_not_hold_refuses_as_before(tmp_path: Path) -> None:
    data = config(tmp_path)
    data["targets"]["comfy"]["waiting"] = {"hold_websockets": False}
    async with warmgate(data) as wg, aiohttp.ClientSession() as client:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await client.ws_connect(ws_url(wg, "tab"))
        assert refused.value.status == 503
        await asyncio.sleep(0)


def test_the_default_is_the_engines_and_a_bad_value_names_the_key(tmp_path: Path) -> None:
    data = config(tmp_path)
    assert parse_config(data, "<t>", ".").targets["comfy"].holds_websockets
    data["targets"]["comfy"]["engine"] = "gradio"
    assert not parse_config(data, "<t>", ".").targets["comfy"].holds_websockets
    data["targets"]["comfy"]["waiting"] = {"hold_websockets": True}
    assert parse_config(data, "<t>", ".").targets["comfy"].holds_websockets
    data["targets"]["comfy"]["waiting"] = {"hold_websockets": "sometimes"}
    with pytest.raises(ConfigError) as error:
        parse_config(data, "<t>", ".")
    assert "targets.comfy.waiting.hold_websockets" in str(error.value)


async def test_what_the_tab_said_while_held_goes_first_and_a_crash_holds_it_again() -> None:
    """Any engine may hold (here the generic one, an echoing websocket): the tab's message sent
    while the target was cold reaches the engine once bridged, and when the engine dies under
    the bridge the tab's socket is held again, not closed, until the next start."""
    command = [sys.executable, "-m", "tests.sleepy_engine", "--port", "{port}", "--load", "0.2"]
    data = {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {
            "t": {
                "routes": [{"path_prefix": "/"}],
                "backend": {"kind": "process", "command": command, "cwd": str(ROOT)},
                "readiness": {"path": "/readyz", "interval": "50ms"},
                "scaling": {"failure_backoff": "100ms"},
                "waiting": {"hold_websockets": True},
            }
        },
    }
    async with warmgate(data) as wg, aiohttp.ClientSession() as client:
        runtime = wg.runtime()
        async with client.ws_connect(wg.url + "/ws") as ws:
            await ws.send_str("said while held")
            await nothing_comes(ws, 0.5)
            async with client.get(wg.url + "/hello") as resp:  # wakes it
                assert resp.status == 200
            assert await ws.receive_str(timeout=10) == "said while held"

            first = runtime.backend.observe().endpoints
            with contextlib.suppress(aiohttp.ClientError):
                async with client.get(wg.url + "/crash") as resp:
                    await resp.read()
            await wait_until(lambda: runtime.state.phase is not Phase.READY, timeout=10)
            await wait_until(lambda: runtime.activity.held_sockets == 1, timeout=10)
            assert not ws.closed
            async with client.get(wg.url + "/hello") as resp:  # started again
                assert resp.status == 200
            assert runtime.backend.observe().endpoints != first
            await ws.send_str("after the crash")
            assert await ws.receive_str(timeout=10) == "after the crash"


async def status_sid(ws: aiohttp.ClientWebSocketResponse) -> str:
    """The client id the engine gave the socket: its first message is ComfyUI's ``status`` with
    the ``sid``."""
    msg = await ws.receive(timeout=30)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    data = json.loads(msg.data)
    assert data["type"] == "status", data
    return str(data["data"]["sid"])


async def test_a_tab_without_a_client_id_keeps_the_one_it_was_given_across_a_release(
    tmp_path: Path,
) -> None:
    """ComfyUI's page opens its first socket as plain ``/ws`` and learns its client id from the
    engine's first ``status`` frame; bridged again to a new engine process after a release, the
    socket asks for that id (``?clientId=``), so the tab gets its next render's frames."""
    data = config(tmp_path, idle_after="1s", stream_activity_window="200ms")
    async with warmgate(data) as wg, aiohttp.ClientSession() as client:
        comfy = wg.runtime("comfy")
        plain = wg.url.replace("http", "ws", 1) + "/comfy/ws"
        async with client.ws_connect(plain) as ws:
            wake = asyncio.ensure_future(render(client, wg, "someone else"))
            sid = await status_sid(ws)  # bridged once the engine listens
            await wake
            first = await render(client, wg, sid)
            assert "executed" in await messages_of(ws, first)
            pid = comfy.backend.observe().endpoints

            await wait_until(lambda: comfy.state.phase is Phase.COLD, timeout=20)
            await wait_until(lambda: comfy.activity.held_sockets == 1, timeout=5)
            await read_what_came(ws)

            second = asyncio.ensure_future(render(client, wg, sid))  # a new process
            assert await status_sid(ws) == sid, "bridged again under another client id"
            prompt_id = await second
            assert comfy.backend.observe().endpoints != pid
            assert "executed" in await messages_of(ws, prompt_id)
