"""router.scale.machine: every phase change is a row of one table, made by one applier; the
rule that nothing else writes a target's state is checked over the source tree."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from router.config import Scaling
from router.metrics import Metrics
from router.scale.machine import BACK, TABLE, Event, InvalidTransition, Machine, rows
from router.scale.state import Phase, StateCell, TargetState

ROOT = Path(__file__).resolve().parents[2]


def machine(phase: Phase = Phase.COLD, **fields: object) -> Machine:
    loop = asyncio.get_event_loop_policy().get_event_loop()
    cell = StateCell(TargetState(phase, 0.0, **fields))  # type: ignore[arg-type]
    return Machine("t", cell, loop, Metrics(), Scaling())


def test_a_start_to_ready_and_a_release_go_through_the_table() -> None:
    m = machine()
    seen: list[str] = []
    m.cell.subscribe(lambda old, new: seen.append(new.phase.value))
    m.apply(Event.START, "a request is waiting", endpoints=())
    m.apply(Event.STAGE, stage="loading", stage_message="", progress=0.5)
    assert m.state.stage == "loading" and m.state.reason == "a request is waiting"
    m.apply(Event.READY, "ready after 1.0s", endpoints=("http://a",))
    assert m.state.stage is None and m.state.progress is None, "a stage belongs to one start"
    m.apply(Event.DRAIN, "idle for 60s")
    m.apply(Event.COMMIT, "idle for 60s")
    m.apply(Event.RELEASED, "idle for 60s", endpoints=())
    assert seen == ["starting", "starting", "ready", "draining", "draining", "cold"]
    assert m.state.stopping is False, "a stop belongs to one drain"


def test_a_change_the_table_does_not_hold_is_refused_and_writes_nothing() -> None:
    m = machine()
    before = m.state
    with pytest.raises(InvalidTransition, match="no 'woke' in phase cold"):
        m.apply(Event.WOKE, "woke")
    assert m.state is before


def test_a_cancelled_drain_goes_back_to_where_it_began_with_the_endpoints_of_now() -> None:
    for start in (Phase.READY, Phase.FAILED, Phase.PARKED):
        m = machine(start, endpoints=("http://a",), failures=2, retry_at=9.0)
        m.apply(Event.DRAIN, "idle for 60s")
        assert m.state.phase is Phase.DRAINING and m.state.back_to is not None
        back = m.apply(Event.PUT_OFF, "drain cancelled")
        assert back.phase is start and back.reason == "drain cancelled" and not back.stopping
        assert (back.failures, back.retry_at) == (2, 9.0) and m.state.back_to is None


def test_never_ready_without_an_endpoint() -> None:
    m = machine(Phase.STARTING)
    assert m.apply(Event.READY, "ready", endpoints=()).phase is Phase.STARTING
    m = machine(Phase.DRAINING, endpoints=("http://a",), stopping=True)
    state = m.apply(Event.UNFENCE, "the leader called the release off", endpoints=())
    assert state.phase is Phase.STARTING and state.reason == "no ready endpoint; waiting for one"


def test_in_place_changes_keep_the_phase_s_since() -> None:
    m = machine(Phase.COLD)
    assert m.apply(Event.QUEUE, "waiting for the GPU").since == 0.0


def test_every_row_leads_to_a_phase_and_every_phase_is_left_somehow() -> None:
    assert {nxt for nxt in TABLE.values()} - set(Phase) == {BACK}
    left = {phase for (phase, _), nxt in TABLE.items() if nxt is not phase}
    assert left == set(Phase)
    assert len(rows()) == len(TABLE)


def test_only_the_machine_writes_a_target_s_state() -> None:
    """One file writes the cell, one builds a new phase (besides the snapshot's own module)."""
    writers, builders = set(), set()
    for path in sorted((ROOT / "router").rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(ROOT))
        if re.search(r"\bcell\.replace\(", text):
            writers.add(name)
        if re.search(r"\.with_phase\(", text) and not name.endswith("scale/state.py"):
            builders.add(name)
    assert writers == {"router/scale/machine.py"}
    assert builders == {"router/scale/machine.py"}


def test_the_architecture_doc_shows_the_table() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for phase, event, nxt in rows():
        assert f"| {phase} | {event} | {nxt} |" in doc, (phase, event, nxt)
