"""A target's day (router/scale/timeline.py): its strip follows the state cell the phase
machine writes, is sampled for busy or idle, keeps its marks, is bounded, and survives a
restart through a state store with the gap in between told as ``unknown``."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.dashboard import charts
from router.scale.persist import FileStore
from router.scale.state import Phase, StateCell, TargetState
from router.scale.timeline import KEY, MAX_SEGMENTS, WINDOW, Timeline, label_of
from tests.dashboard.test_dashboard import config as dashboard_config
from tests.helpers import warmgate


class Clock:
    """Wall-clock time as the timelines read it: the loop's time plus their offset, set here."""

    def __init__(self, now: float) -> None:
        self.now = now


def at(timeline: Timeline, clock: Clock, to: float) -> float:
    """Wall time ``to`` from now on (the loop's clock is left alone); the loop time of it."""
    clock.now = to
    loop_now = asyncio.get_running_loop().time()
    timeline.offset = to - loop_now
    return loop_now


def recorder(clock: Clock, busy: list[bool], held: list[int]) -> tuple[Timeline, StateCell]:
    loop = asyncio.get_running_loop()
    timeline = Timeline("t", loop, lambda: busy[0], lambda: held[0])
    loop_now = at(timeline, clock, clock.now)
    cell = StateCell(TargetState(Phase.COLD, loop_now, reason="not started"))
    cell.subscribe(timeline.on_state)
    timeline.sample(cell.current)
    return timeline, cell


def sample(timeline: Timeline, cell: StateCell, clock: Clock, to: float) -> None:
    at(timeline, clock, to)
    timeline.sample(cell.current)


def move(cell: StateCell, timeline: Timeline, clock: Clock, to: float, **state: object) -> None:
    """The phase machine's write, at wall time ``to``."""
    loop_now = at(timeline, clock, to)
    current = cell.current
    phase = state.pop("phase", current.phase)
    assert isinstance(phase, Phase)
    if phase is current.phase:
        import dataclasses

        cell.replace(dataclasses.replace(current, **state))  # type: ignore[arg-type]
    else:
        cell.replace(current.with_phase(phase, loop_now, **state))


def test_labels_say_phase_stage_and_busy() -> None:
    state = TargetState(Phase.STARTING, 0.0, stage="pulling")
    assert label_of(state, busy=False) == "starting:pulling"
    assert label_of(TargetState(Phase.READY, 0.0), busy=True) == "busy"
    assert label_of(TargetState(Phase.READY, 0.0), busy=False) == "idle"
    assert label_of(TargetState(Phase.PARKED, 0.0, waking=True), busy=False) == "starting:waking"


async def test_the_strip_follows_the_cell_and_marks_what_requests_met() -> None:
    clock, busy, held = Clock(1_000_000.0), [False], [0]
    timeline, cell = recorder(clock, busy, held)
    held[0] = 2
    move(cell, timeline, clock, 1_000_010.0, phase=Phase.STARTING, stage="pulling")
    move(cell, timeline, clock, 1_000_040.0, stage="loading")
    busy[0] = True
    move(cell, timeline, clock, 1_000_070.0, phase=Phase.READY, endpoints=("http://x",))
    busy[0] = False
    sample(timeline, cell, clock, 1_000_100.0)
    move(cell, timeline, clock, 1_000_200.0, phase=Phase.PARKED)
    move(cell, timeline, clock, 1_000_300.0, waking=True)
    move(cell, timeline, clock, 1_000_302.0, phase=Phase.READY)
    labels = [label for _, label in timeline.segments]
    assert labels == [
        "cold", "starting:pulling", "starting:loading", "busy", "idle", "parked",
        "starting:waking", "idle",
    ]  # fmt: skip
    marks = [m.to_json() for m in timeline.marks]
    assert marks == [
        {"at": 1_000_010.0, "kind": "cold start", "held": 2, "seconds": 60.0, "outcome": "ready"},
        {"at": 1_000_300.0, "kind": "wake", "held": 2, "seconds": 2.0, "outcome": "ready"},
    ]
    seconds = timeline.seconds(1_000_000.0, 1_000_400.0)
    expected = {"cold": 10.0, "starting": 62.0, "busy": 30.0, "idle": 198.0, "parked": 100.0}
    assert seconds == pytest.approx(expected, abs=0.01)
    assert timeline.waits(0.0) == pytest.approx([60.0, 2.0], abs=0.01)


async def test_a_wait_that_ended_in_a_failed_start_is_a_wait_of_its_own_kind() -> None:
    clock, busy, held = Clock(1_500_000.0), [False], [1]
    timeline, cell = recorder(clock, busy, held)
    move(cell, timeline, clock, 1_500_010.0, phase=Phase.STARTING, stage="loading")
    move(cell, timeline, clock, 1_500_025.0, phase=Phase.FAILED, reason="exited with code 1")
    move(cell, timeline, clock, 1_500_100.0, phase=Phase.STARTING, stage="loading")
    move(cell, timeline, clock, 1_500_130.0, phase=Phase.READY, endpoints=("http://x",))
    move(cell, timeline, clock, 1_500_200.0, phase=Phase.PARKED)
    move(cell, timeline, clock, 1_500_300.0, waking=True)
    move(cell, timeline, clock, 1_500_301.5, phase=Phase.READY)
    failed, *_ = [m.to_json() for m in timeline.marks]
    assert failed == {
        "at": 1_500_010.0, "kind": "cold start", "held": 1, "seconds": None,
        "outcome": "failed", "ended": 15.0,
    }  # fmt: skip
    waits = timeline.waits_by_kind(0.0)
    assert {kind: [round(w, 2) for w in ws] for kind, ws in waits.items()} == {
        "cold start": [30.0], "wake": [1.5], "failed": [15.0]
    }  # fmt: skip
    view = {"t": {"waits_today_by_kind": waits}}
    drawn = charts.waits_histogram(view)
    fills = dict(re.findall(r'data-kind="([^"]+)" data-count="1" .*? fill="(#\w+)"', drawn))
    assert set(fills) == {"cold start", "wake", "failed"}, "a failed wait is drawn too"
    assert len(set(fills.values())) == 3, "wakes, cold starts and failures in colours apart"
    assert "failed 1" in re.sub(r"<[^>]+>", "", drawn), "the legend counts each"


async def test_it_is_bounded_by_the_window_and_a_count() -> None:
    clock, busy, held = Clock(2_000_000.0), [False], [0]
    timeline, cell = recorder(clock, busy, held)
    move(cell, timeline, clock, 2_000_001.0, phase=Phase.READY, endpoints=("http://x",))
    for i in range(2 * MAX_SEGMENTS):
        busy[0] = i % 2 == 0
        sample(timeline, cell, clock, 2_000_002.0 + i)
    assert len(timeline.segments) == MAX_SEGMENTS
    busy[0] = not busy[0]
    sample(timeline, cell, clock, clock.now + 2 * WINDOW)
    (first, _), (last, _) = timeline.segments
    assert len(timeline.segments) == 2, "what ended before the window is forgotten"
    assert first < last - WINDOW, "the one that spans the window's start stays"


async def test_a_restart_keeps_the_day_and_tells_the_gap(tmp_path: Path) -> None:
    store = FileStore(tmp_path, "t.")
    clock, busy, held = Clock(3_000_000.0), [False], [1]
    timeline, cell = recorder(clock, busy, held)
    timeline.store = store
    await timeline.open()
    move(cell, timeline, clock, 3_000_100.0, phase=Phase.STARTING)
    move(cell, timeline, clock, 3_000_130.0, phase=Phase.READY, endpoints=("http://x",))
    at(timeline, clock, 3_000_200.0)
    await timeline.close()
    kept = json.loads((tmp_path / f"t.{KEY}.json").read_text())
    assert [label for _, label in kept["segments"]] == ["cold", "starting", "idle"]

    clock.now = 3_000_500.0  # warmgate was down from 3_000_200 on
    again, cell = recorder(clock, busy, held)
    again.store = store
    await again.open()
    assert [label for _, label in again.segments] == ["cold", "starting", "idle", "unknown",
                                                      "cold"]  # fmt: skip
    assert again.segments[3][0] == 3_000_200.0
    assert [m.kind for m in again.marks] == ["cold start"]
    await again.close()


async def test_a_document_of_nonsense_is_ignored(tmp_path: Path) -> None:
    (tmp_path / f"t.{KEY}.json").write_text('{"v": 1, "until": 1, "segments": [[1, "rainbow"]]}')
    clock = Clock(4_000_000.0)
    timeline, _ = recorder(clock, [False], [0])
    timeline.store = FileStore(tmp_path, "t.")
    await timeline.open()
    assert [label for _, label in timeline.segments] == ["cold"]
    await timeline.close()


def test_the_strip_is_svg_with_a_rect_per_phase_and_a_mark_per_wait() -> None:
    tl = {
        "segments": [[0, "cold"], [100, "starting:pulling"], [160, "busy"], [400, "idle"]],
        "marks": [{"at": 100, "kind": "cold start", "held": 3, "seconds": 60.0}],
    }
    svg = charts.strip("comfy", tl, 0, 1000, "day")
    assert svg.startswith("<svg") and svg.endswith("</svg>" + charts.tick_labels(0, 1000, 3 * 3600))
    assert svg.count('class="seg"') == 4 and 'data-label="starting:pulling"' in svg
    assert 'data-kind="cold start"' in svg and "3 held, ready after 60s" in svg
    assert charts.wait_counts([5, 12, 12, 400]) == [
        ("<10s", 1), ("10-30s", 2), ("30-60s", 0), ("1-2m", 0), ("2-5m", 0), (">5m", 1),
    ]  # fmt: skip


async def test_a_cold_start_is_drawn_and_a_restart_keeps_the_day(tmp_path: Path) -> None:
    data = dashboard_config(load=0.3)
    data["state_dir"] = str(tmp_path / "state")
    async with warmgate(data) as wg, aiohttp.ClientSession() as session:
        async with session.get(wg.url + "/hello") as response:
            assert response.status == 200

        async def timeline() -> dict[str, Any]:
            async with session.get(wg.admin + "/status") as response:
                view = await response.json()
            return view["targets"]["sleepy"]  # type: ignore[no-any-return]

        t = await timeline()
        labels = [label for _, label in t["timeline"]["segments"]]
        assert labels[0] == "cold" and labels[1].startswith("starting")
        assert labels[-1] in ("busy", "idle")
        [mark] = t["timeline"]["marks"]
        assert mark["kind"] == "cold start" and mark["held"] == 1 and mark["seconds"] > 0
        assert t["waits_today"] == [mark["seconds"]]
        assert set(t["gpu_hours_today"]) == {"busy", "idle", "parked", "starting"}
        assert t["gpu_hours_today"]["starting"] > 0
        async with session.get(wg.admin + "/") as response:
            page = await response.text()
        assert '<section id="day">' in page
        assert 'class="strip day"' in page and 'class="strip hour"' in page
        assert 'data-target="sleepy"' in page and 'class="mark" data-kind="cold start"' in page
        assert 'class="gpu-hours"' in page and 'class="waits"' in page
    kept = json.loads((tmp_path / "state" / f"sleepy.{KEY}.json").read_text())
    assert [label for _, label in kept["segments"]][:2] == labels[:2]

    async with (
        warmgate(data) as wg,
        aiohttp.ClientSession() as session,
        session.get(wg.admin + "/status") as response,
    ):
        again = (await response.json())["targets"]["sleepy"]
    labels_again = [label for _, label in again["timeline"]["segments"]]
    assert labels_again[: len(labels) - 1] == labels[:-1], "the day before the restart stays"
    assert "unknown" in labels_again[len(labels) - 1 :] or labels_again[-1] == "cold"
    assert again["timeline"]["marks"] == t["timeline"]["marks"]


HOSTILE = {
    "minus infinity": '{"v": 1, "until": 1, "segments": [[-Infinity, "cold"]], "marks": []}',
    "before 1970": '{"v": 1, "until": 1, "segments": [[-1e21, "cold"]], "marks": []}',
    "held 1e400": '{"v": 1, "until": 1, "segments": [[1, "cold"]], "marks": '
    '[{"at": 1, "kind": "wake", "held": 1e400, "seconds": null}]}',
    "held 10**400": '{"v": 1, "until": 1, "segments": [[1, "cold"]], "marks": '
    f'[{{"at": 1, "kind": "wake", "held": {10**400}, "seconds": null}}]}}',
    "at 10**400": f'{{"v": 1, "until": 1, "segments": [[{10**400}, "cold"]]}}',
    "until NaN": '{"v": 1, "until": NaN, "segments": [[1, "cold"]]}',
    "a bool": '{"v": true, "until": true, "segments": [[true, "cold"]]}',
    "a stage of its own": '{"v": 1, "until": 1, "segments": [[1, "starting:<b>x</b>"]]}',
    "a mark of its own": '{"v": 1, "until": 1, "segments": [], "marks": [{"at": 1, "kind": '
    '"<b>", "held": 1}]}',
}


@pytest.mark.parametrize("document", HOSTILE.values(), ids=HOSTILE.keys())
async def test_a_hostile_document_is_ignored_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, document: str
) -> None:
    path = tmp_path / f"t.{KEY}.json"
    path.write_text(document)
    clock = Clock(4_000_000.0)
    timeline, _ = recorder(clock, [False], [0])
    timeline.store = FileStore(tmp_path, "t.")
    await timeline.open()
    assert [label for _, label in timeline.segments] == ["cold"]
    assert list(timeline.marks) == []
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and str(path) in warned[0], warned
    await timeline.close()


async def test_a_strip_kept_ahead_of_this_clock_is_clamped_to_now(tmp_path: Path) -> None:
    """Written under a clock an hour fast: its idle never covers the cold start after the
    restart (nor counts its GPU-hours)."""
    now = 5_000_000.0
    ahead = {
        "v": 1,
        "until": now + 3600,
        "segments": [[now - 600, "cold"], [now - 300, "idle"], [now + 1800, "busy"]],
        "marks": [{"at": now + 1000, "kind": "wake", "held": 1, "seconds": 2.0}],
    }
    (tmp_path / f"t.{KEY}.json").write_text(json.dumps(ahead))
    clock = Clock(now)
    timeline, cell = recorder(clock, [False], [1])
    timeline.store = FileStore(tmp_path, "t.")
    await timeline.open()
    assert [label for _, label in timeline.segments] == ["cold", "idle", "cold"]
    assert max(at for at, _ in timeline.segments) <= timeline.now()
    assert list(timeline.marks) == []
    move(cell, timeline, clock, now + 10, phase=Phase.STARTING)
    move(cell, timeline, clock, now + 70, phase=Phase.READY, endpoints=("http://x",))
    seconds = timeline.seconds(now, now + 70)
    assert seconds.get("idle", 0.0) < 0.1 and seconds.get("busy", 0.0) == 0.0, seconds
    assert seconds["starting"] == pytest.approx(60.0) and seconds["cold"] == pytest.approx(
        10.0, abs=0.1
    )
    await timeline.close()


def test_the_first_clock_of_a_strip_begins_at_its_tick_not_before_the_edge() -> None:
    since = 1_764_917_370.0  # 06:49:30 UTC: the first tick, 06:50, is 30 s from the edge
    labels = charts.tick_labels(since, since + 3600, 600)
    first, *rest = re.findall(r'<span class="(\w+)" style="left:[\d.]+%">([\d:]+)<', labels)
    assert first == ("start", "06:50"), "aligned to its tick's side: never cut"
    assert [clock for _, clock in rest] == ["07:00", "07:10", "07:20", "07:30", "07:40"]
    assert {side for side, _ in rest} == {"mid"}
    assert 'class="end"' in charts.tick_labels(since - 510, since + 3090, 600), "the last one"
