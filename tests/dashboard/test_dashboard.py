"""The dashboard on the admin listener over HTTP: the page rendered on the server (it reads the
same with JavaScript off), its assets, ``GET /events``, and the actions with and without the admin
token. tests/dashboard/test_dashboard_browser.py drives the page itself in Chromium."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.config import parse_config
from router.dashboard.charts import day_section
from router.dashboard.page import events_section
from router.dashboard.targets import idle_after, target_card
from router.errors import ConfigError
from router.server import Server
from tests.cluster.test_replicas_budget import REPLICAS_TOKEN_FILE, table  # noqa: F401 - a fixture
from tests.helpers import ROOT, wait_until, warmgate

TOKEN = "a-long-admin-token-9f2c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def sleepy(load: float = 0.3, idle_after: str = "10m") -> dict[str, Any]:
    return {
        "routes": [{"path_prefix": "/"}],
        "backend": {
            "kind": "process",
            "command": [
                *("python", "-m", "tests.sleepy_engine", "--port", "{port}"),
                *("--load", str(load)),
            ],
            "cwd": str(ROOT),
            "stop_grace": "2s",
        },
        "readiness": {"path": "/readyz", "interval": "50ms"},
        "scaling": {"idle_after": idle_after},
    }


def config(token_file: str | None = None, **target: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": {
            "sleepy": sleepy(**target),
            "always": {
                "routes": [{"path_prefix": "/always"}],
                "backend": {"kind": "static", "url": "http://127.0.0.1:9"},
            },
        },
    }
    if token_file is not None:
        data["admin"] = {"token_file": token_file}
    return data


@pytest.fixture
def token_dir(tmp_path: Path) -> str:
    (tmp_path / "admin-token").write_text(TOKEN + "\n")
    return str(tmp_path)


async def sse(session: aiohttp.ClientSession, url: str) -> AsyncIterator[tuple[str, Any]]:
    async with session.get(url) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        kind = ""
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                yield kind, json.loads(line[6:])


async def test_the_page_renders_the_state_on_the_server() -> None:
    async with warmgate(config()) as wg, aiohttp.ClientSession() as session:
        async with session.get(wg.admin + "/") as response:
            assert response.status == 200
            assert response.headers["Cache-Control"] == "no-store"
            page = await response.text()
        assert '<article class="card target" id="target-sleepy" data-phase="cold">' in page
        assert 'id="target-always" data-phase="ready"' in page
        assert "Read-only: actions need admin.token_file" in page
        assert 'data-action="wake" data-target="sleepy" disabled' in page
        assert '<meta http-equiv="refresh"' in page, "with JavaScript off it reloads itself"
        assert "cdn" not in page.lower() and "https://" not in page
        for asset, kind in (("dashboard.js", "javascript"), ("dashboard.css", "text/css")):
            async with session.get(f"{wg.admin}/static/{asset}") as response:
                assert response.status == 200 and kind in response.headers["Content-Type"]
        async with session.get(wg.admin + "/?fragment=1") as response:
            fragment = await response.text()
        assert fragment.startswith('<section id="targets">') and "<html" not in fragment


async def test_a_start_shows_one_starting_badge_and_the_footer_sits_in_the_padding() -> None:
    async with warmgate(config()) as wg, aiohttp.ClientSession() as session:
        async with session.get(wg.admin + "/status") as response:
            sleepy_view = (await response.json())["targets"]["sleepy"]
        async with session.get(wg.admin + "/") as response:
            page = await response.text()
        async with session.get(wg.admin + "/static/dashboard.css") as response:
            css = await response.text()
    starting = {**sleepy_view, "phase": "starting", "stage": "starting"}
    card = target_card("sleepy", starting, time.time(), actions=False)
    assert card.count(">starting</span>") == 1, "phase and stage say the same: said once"
    loading = target_card("sleepy", {**starting, "stage": "loading"}, time.time(), False)
    assert '<span class="phase">starting</span> <span class="stage">loading</span>' in loading
    # With JavaScript off, the footer's line has the content's padding (main's rule).
    footer = page.split('<footer class="foot">', 1)[1].split("</footer>", 1)[0]
    assert "<noscript>" in footer and "JavaScript is off" in footer
    assert page.index("</main>") < page.index('<footer class="foot">')
    assert "main, .foot { padding: 0 1rem 2rem;" in css


async def test_events_stream_the_view_and_each_change() -> None:
    async with warmgate(config(load=0.3, idle_after="1s")) as wg, aiohttp.ClientSession() as s:
        seen: list[tuple[str, Any]] = []

        async def follow() -> None:
            async for message in sse(s, wg.admin + "/events"):
                seen.append(message)

        task = asyncio.create_task(follow())
        try:
            await wait_until(lambda: len(seen) >= 2)
            assert seen[0] == ("events", [])
            kind, first = seen[1]
            assert kind == "snapshot" and first["targets"]["sleepy"]["phase"] == "cold"
            async with s.get(wg.url + "/hello") as response:
                assert response.status == 200
            changes = lambda: [m["kind"] for k, m in seen if k == "change"]  # noqa: E731
            await wait_until(lambda: changes()[:2] == ["start", "ready"])
            await wait_until(lambda: changes()[2:] == ["drain", "release"], timeout=10)
            last = [m for k, m in seen if k == "snapshot"][-1]
            sleepy_view = last["targets"]["sleepy"]
            assert sleepy_view["phase"] == "cold" and sleepy_view["reason"].startswith("idle for")
            assert sleepy_view["gpu_seconds_today"]["idle"] >= 1
            assert [s["outcome"] for s in sleepy_view["cold_starts_today"]] == ["ready"]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        async with s.get(wg.admin + "/status") as response:
            view = await response.json()
        assert [e["kind"] for e in view["events"]] == ["release", "drain", "ready", "start"]


async def test_the_streams_end_when_warmgate_stops() -> None:
    async with warmgate(config()) as wg, aiohttp.ClientSession() as session:
        response = await session.get(wg.admin + "/events")
        await response.content.readuntil(b"\n\n")
        server = wg.server
        await asyncio.wait_for(server.stop(), timeout=5)
        await asyncio.wait_for(response.read(), timeout=5)
        response.release()


async def test_actions_are_refused_without_a_token_file() -> None:
    async with warmgate(config()) as wg, aiohttp.ClientSession() as session:
        async with session.post(wg.admin + "/targets/sleepy/wake", headers=AUTH) as response:
            assert response.status == 403
            error = (await response.json())["error"]
        assert error["code"] == "actions_off" and "admin.token_file" in error["message"]
        assert wg.runtime("sleepy").state.phase.value == "cold"


async def test_the_release_countdown_says_the_idle_time_and_a_wake_no_phase_change() -> None:
    async with (
        warmgate(config()) as wg,
        aiohttp.ClientSession() as session,
        session.get(wg.admin + "/status") as response,
    ):
        sleepy_view = (await response.json())["targets"]["sleepy"]
    now = 1_764_612_000.0
    idle = {**sleepy_view, "phase": "ready", "idle_since": now - 13, "release_at": now + 587}
    card = target_card("sleepy", idle, now, actions=False)
    text = re.sub(r"<[^>]+>", "", card)
    assert "Releasein 9m47s (idle for 13s of idle_after 10m00s)" in text
    wake = {"at": now, "target": "comfy", "kind": "wake", "phase": "parked", "from": "parked"}
    ready = {**wake, "kind": "ready", "phase": "ready"}
    shown = re.sub(
        r"<[^>]+>", "", events_section([{**ready, "reason": "r"}, {**wake, "reason": "w"}])
    )
    assert "comfy wake w" in shown and "comfy ready (parked → ready) r" in shown


async def test_the_cards_gpu_seconds_and_the_days_chart_count_the_same() -> None:
    """The card counted no starting time while the chart did: 100 s against 0.07 h."""
    async with (
        warmgate(config()) as wg,
        aiohttp.ClientSession() as session,
        session.get(wg.admin + "/status") as response,
    ):
        view = await response.json()
    sleepy = view["targets"]["sleepy"]
    sleepy["gpu_hours_today"] = {"busy": 7 / 3600, "idle": 72 / 3600, "parked": 0.0,
                                 "starting": 15 / 3600}  # fmt: skip
    del view["targets"]["always"]
    card = re.sub(r"<[^>]+>", "", target_card("sleepy", sleepy, view["now"], False))
    assert "GPU-seconds today7 busy · 72 idle · 15 starting" in card, "not parked: no parked"
    day = re.sub(r"<[^>]+>", "", day_section(view))
    assert "GPU time today: 1m34s (0.03 GPU-hours)" in day, "7 + 72 + 15 s"
    assert "1m34s: 7s busy · 1m12s idle · 15s starting" in day, "the row's values"
    assert "busy idle (draining included) parked starting (and waking)" in day, "a legend"


async def test_actions_with_the_token(token_dir: str) -> None:
    data = config("admin-token", load=0.3)
    async with warmgate(data, token_dir) as wg, aiohttp.ClientSession() as session:

        async def post(path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
            async with session.post(wg.admin + path, headers=headers) as response:
                return response.status, await response.json()

        status, body = await post("/targets/sleepy/wake")
        assert status == 401 and body["error"]["message"] == "the admin token is needed " \
            "(Authorization: Bearer)"  # fmt: skip
        status, body = await post("/targets/sleepy/wake", {"Authorization": "Bearer nope"})
        assert status == 401 and body["error"]["message"] == "the admin token is wrong"
        assert (await post("/targets/nope/wake", AUTH))[0] == 404
        status, body = await post("/targets/sleepy/park", AUTH)
        assert (status, body["error"]["message"]) == (
            409,
            "parking is not available for this target",
        )
        assert (await post("/targets/always/release", AUTH))[0] == 409
        assert (await post("/targets/sleepy/release", AUTH))[0] == 409, "cold"

        # wake: the start a held request makes, without one.
        status, body = await post("/targets/sleepy/wake", AUTH)
        assert status == 202 and body["result"] == "starting"
        runtime = wg.runtime("sleepy")
        await wait_until(lambda: runtime.state.phase.value == "ready")

        # release never cuts work in flight ...
        slow = asyncio.create_task(session.get(wg.url + "/slow?s=1"))
        await wait_until(lambda: runtime.activity.in_flight == 1)
        status, body = await post("/targets/sleepy/release", AUTH)
        assert status == 409 and "1 requests are in flight" in body["error"]["message"]
        response = await slow
        assert response.status == 200 and await response.text() == "slow done"
        response.release()
        # ... and once idle, it is the release of idleness, at once.
        status, body = await post("/targets/sleepy/release", AUTH)
        assert status == 202
        await wait_until(lambda: runtime.state.phase.value == "cold")
        assert runtime.state.reason == "released by an operator"

        async with session.get(wg.admin + "/status") as response:
            view = await response.json()
        kinds = [e["kind"] for e in view["events"]]
        assert kinds[:3] == ["release", "drain", "release asked"] and "wake asked" in kinds
        asked = view["events"][2]["reason"]
        assert asked == "through the admin API: released as idle: it drains and stops now"
        assert view["actions"] is True


async def test_an_operator_release_says_so_and_teaches_the_idle_rule_nothing(
    token_dir: str,
) -> None:
    """The release is an input its lifecycle decides on, not a clock set back: the phase
    changes give its own reason, the idle time stays the real one, and the gap it ends is not
    learned by ``idle_after: auto`` (a gap of ``idle_after`` that never happened, before)."""
    data = config("admin-token", load=0.3, idle_after="auto")
    data["targets"]["sleepy"]["scaling"]["idle_bounds"] = ["1s", "1h"]
    async with warmgate(data, token_dir) as wg, aiohttp.ClientSession() as session:
        runtime = wg.runtime("sleepy")
        policy = runtime.learned.idling.policy
        assert policy is not None
        async with session.get(wg.url + "/slow?s=0") as response:
            assert response.status == 200
        window = runtime.spec.scaling.stream_activity_window
        idle_for = lambda: runtime.loop.time() - (runtime.activity.idle_since(window) or 0.0)  # noqa: E731
        await wait_until(lambda: idle_for() >= 1.5)  # past the lower bound: a gap worth learning
        changes: list[tuple[str, str]] = []
        runtime.cell.subscribe(lambda old, new: changes.append((new.phase.value, new.reason)))
        async with session.post(wg.admin + "/targets/sleepy/release", headers=AUTH) as response:
            assert response.status == 202
        await wait_until(lambda: runtime.state.phase.value == "cold")
        assert [phase for phase, _ in changes][-1] == "cold" and "draining" in dict(changes)
        assert {reason for _, reason in changes} == {"released by an operator"}
        assert 1.5 <= idle_for() < 600, "the idle time is the real one"
        async with session.get(wg.url + "/slow?s=0") as response:  # held through a cold start
            assert response.status == 200
        assert runtime.state.phase.value == "ready"
        assert policy.gaps == 0, "the gap an operator's release ended is not learned"


async def test_a_token_file_that_cannot_be_read_stops_the_start(tmp_path: Path) -> None:
    for content in (None, "", "two words\n"):
        path = tmp_path / "token"
        path.unlink(missing_ok=True)
        if content is not None:
            path.write_text(content)
        server = Server(parse_config(config("token"), "warmgate.yaml", str(tmp_path)))
        with pytest.raises(ConfigError, match=r"warmgate.yaml: admin.token_file: .*token"):
            await server.start()
        await server.stop()


async def test_replicas_show_each_replica_the_leader_and_when_it_was_last_heard(
    table: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    def replica(name: str) -> dict[str, Any]:
        data = config()
        data["replicas"] = {
            "namespace": "warmgate",
            "service": "warmgate-peers",
            "identity": name,
            "poll_interval": "100ms",
            "token_file": str(REPLICAS_TOKEN_FILE),
        }
        return data

    async with (
        warmgate(replica("warmgate-0")) as a,
        warmgate(replica("warmgate-1")) as b,
        aiohttp.ClientSession() as session,
    ):
        table.update({"warmgate-0": a.admin, "warmgate-1": b.admin})

        async def view(admin: str) -> Any:
            async with session.get(admin + "/status") as response:
                return (await response.json())["replicas"]

        async with asyncio.timeout(10):  # until each has read the other
            while True:
                on_a, on_b = await view(a.admin), await view(b.admin)
                if on_b["peers"] and on_a["peers"] and on_a["peers"][0]["reachable"]:
                    break
                await asyncio.sleep(0.05)
        assert (on_a["self"], on_a["leading"]) == ("warmgate-0", True)
        assert (on_b["self"], on_b["leading"]) == ("warmgate-1", False)
        (peer,) = on_a["peers"]
        assert peer["name"] == "warmgate-1" and peer["reachable"] is True
        assert peer["heard_at"] is not None
        async with session.get(a.admin + "/") as response:
            page = await response.text()
        assert '<section id="replicas">' in page
        assert "<td>warmgate-0 (this one)</td><td>leader</td>" in page
        assert "<td>warmgate-1</td>" in page


def test_idle_after_auto_says_what_it_learned_from_in_words() -> None:
    def row(gaps: int, learned: bool) -> dict[str, Any]:
        idle = {"learned": {"learned": learned, "gaps": gaps, "gaps_needed": 1}}
        return {"idle_after": 3600.0 if not learned else 660.0, "idle": idle}

    assert idle_after(row(0, False)).endswith("auto: the upper bound until 1 gap (0 seen)")
    assert idle_after(row(1, True)).endswith("learned from 1 gap")
    assert idle_after(row(23, True)).endswith("learned from 23 gaps")
    assert idle_after({"idle_after": 600.0}) == idle_after({"idle_after": 600.0, "idle": {}})
