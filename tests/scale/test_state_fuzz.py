"""A hostile ``state_dir``, fuzzed: hypothesis writes each document a target reads at start
(its day, its cold starts, its wakes, its idle histogram) and the day's spend as random JSON of
random shapes, a document of warmgate's own form with random values in it (huge numbers, NaN,
infinities, bools, strings, lists), random bytes, or puts another kind of file in its place (a
FIFO, a link out of ``state_dir``, a directory, an empty file, one over the size limit).

The property: reading never raises and never hangs; every reader takes a document or refuses it
without an exception (the warning net of ``read_back`` is never what saves it); a file is warned
of at most once; and the target still opens, starts on a request and is released when idle.

``make test`` runs the ``fast`` profile (300 examples, derandomized); ``make fuzz`` the ``fuzz``
profile (``HYPOTHESIS_PROFILE=fuzz``, 10,000 examples), and prints how many ran.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import looptime
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.documents import MAX_DOCUMENT
from router.config import parse_config
from router.metrics import Metrics
from router.openai.budget import Budget, spend_of
from router.scale.eta import ColdStarts
from router.scale.idle_policy import IdlePolicy
from router.scale.lifecycle import Lifecycle
from router.scale.persist import FileStore
from router.scale.state import Phase
from router.scale.targets import TargetRuntime
from router.scale.wakes import Wakes
from tests.fakes import FakeBackend, FakeEngine
from tests.fuzzing import FUZZ, examples
from tests.rig import Rig

PROFILE = examples(300, 10_000)
RAN = {"examples": 0, "refused": 0}
"""Examples run and documents refused with a warning (tests/scale/conftest.py prints them)."""

pytestmark = pytest.mark.timeout(0 if FUZZ else 600)

KEYS = ("timeline", "cold-start", "wake", "idle")
NOW = 1_700_000_000.0

HUGE = st.integers(min_value=10**300, max_value=10**400) | st.integers(max_value=-(10**300))
NUMBER = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers()
    | HUGE
    | st.sampled_from([0, 1, 2.5, 60.0, NOW, NOW + 3600, -1e21, 1e308, 86_401.0])
)
SCALAR = st.none() | st.booleans() | NUMBER | st.text(max_size=12)
ANY_JSON = st.recursive(
    SCALAR,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
VALUE = NUMBER | SCALAR | ANY_JSON
"""What stands where warmgate wrote a number: mostly numbers of every kind, else anything."""


def _own_form(key: str, x: list[Any]) -> dict[str, Any]:
    """A document of warmgate's own form for ``key``, with ``x`` where its values were."""
    if key == "timeline":
        return {
            "v": x[0],
            "until": x[1],
            "segments": [[x[2], "cold"], [x[3], x[4]], [x[5], "starting:loading"]],
            "marks": [{"at": x[6], "kind": "wake", "held": x[7], "seconds": x[8]}],
        }
    if key == "cold-start":
        return {
            "version": x[0],
            "starts": [x[1], x[2]],
            "stages": {"loading": [x[3]], "pulling": x[4]},
        }
    if key == "wake":
        return {"version": x[0], "wakes": [x[1], x[2], x[3]]}
    if key == "idle":
        return {"version": x[0], "ratio": 1.08, "gaps": x[1], "bins": {"3": x[2], "7": x[3]}}
    return {"day": x[0], "spent": x[1], "reserved": x[2], "by_model": {"m": [[x[3], x[4]]]}}


def _text(document: Any, big_as_text: bool) -> str:
    text = json.dumps(document)  # NaN, Infinity, -Infinity as Python writes them
    return text.replace("Infinity", "1e400") if big_as_text else text


def content(key: str) -> st.SearchStrategy[tuple[str, Any]]:
    """(kind of file, what is in it)."""
    valid = st.sampled_from([1, 1, 30.0, NOW - 60, "idle", "2023-11-14"])
    own = st.builds(
        _own_form, st.just(key), st.lists(valid | VALUE, min_size=9, max_size=9)
    ).flatmap(lambda d: st.tuples(st.just(d), st.booleans()))
    regular = st.one_of(
        own.map(lambda pair: ("document", pair)),
        ANY_JSON.map(lambda d: ("document", (d, False))),
        st.binary(max_size=64).map(lambda b: ("bytes", b)),
        st.integers(1, 200).map(lambda n: ("bytes", b"[" * n * 100)),
    )
    other = st.sampled_from(
        ["missing", "fifo", "link out", "link to a device", "dangling link", "directory",
         "empty", "oversized"]
    ).map(lambda kind: (kind, None))  # fmt: skip
    return st.one_of(regular, regular, other)


STATE = st.fixed_dictionaries({key: content(key) for key in (*KEYS, "budget")})


def plant(directory: Path, outside: Path, path: Path, kind: str, what: Any) -> Any:
    """Put ``kind`` at ``path``; the document as Python holds it, where there is one."""
    if kind == "document":
        document, big_as_text = what
        path.write_text(_text(document, big_as_text))
        return document
    if kind == "bytes":
        path.write_bytes(what)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link out":
        path.symlink_to(outside)
    elif kind == "link to a device":
        path.symlink_to("/dev/zero")
    elif kind == "dangling link":
        path.symlink_to(directory / "nowhere")
    elif kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.touch()
    elif kind == "oversized":
        with path.open("wb") as f:
            f.truncate(MAX_DOCUMENT + 1)  # sparse: its size is what counts
    return None


def readers_take(document: Any, rig: Rig) -> None:
    """Every reader takes or refuses ``document`` without raising."""
    if not isinstance(document, dict):
        return
    assert isinstance(ColdStarts(30.0).restore(document), bool)
    assert isinstance(Wakes(2.0).load(document), bool)
    assert isinstance(IdlePolicy((120.0, 3600.0), 2 / 3600, 0.01).load_json(document), bool)
    budget = Budget(10.0, clock=lambda: NOW)
    assert isinstance(budget.restore(document), bool)
    _, usd = spend_of(document)
    assert usd is None or (math.isfinite(usd) and usd >= 0)
    assert math.isfinite(budget.spent) and all(
        math.isfinite(t) and math.isfinite(u) for line in budget.by_model.values() for t, u in line
    )


def make_rig() -> Rig:
    config = parse_config(
        {
            "targets": {
                "t": {
                    "routes": [{}],
                    "backend": {"kind": "process", "command": ["engine"]},
                    "scaling": {"idle_after": "auto", "idle_bounds": ["5s", "5s"]},
                }
            }
        }
    )
    backend, engine, metrics = FakeBackend(), FakeEngine(), Metrics()
    loop = asyncio.get_running_loop()
    runtime = TargetRuntime("t", config.targets["t"], backend, engine, metrics, loop)
    return Rig(runtime, backend, engine, Lifecycle(runtime), metrics, labels={"target": "t"})


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def scenario(directory: Path, planted: dict[str, Any], warned: Warnings) -> None:
    store = FileStore(directory, "t.")
    rig = make_rig()
    for key in KEYS:  # each document as the store hands it over, to each reader
        readers_take(await store.load(key), rig)
        readers_take(planted.get(key), rig)
        if isinstance(document := planted.get(key), dict):  # a store hands over objects only
            assert isinstance(rig.runtime.timeline.restore(document), bool)
    readers_take(await FileStore(directory).load("budget"), rig)
    await FileStore(directory).load_all("budget.")
    rig.runtime.learned.store = rig.runtime.timeline.store = store
    warned.lines.clear()  # what a start says: one warning a document at most
    await rig.lifecycle.open()
    try:
        assert rig.phase is Phase.COLD
        assert await rig.serve(1.0) >= 0
        await rig.until(Phase.COLD)  # released when idle
        assert rig.backend.calls == ["up", "down"]
    finally:
        await rig.lifecycle.close()


@PROFILE
@given(state=STATE)
def test_a_hostile_state_dir_never_stops_a_start_nor_a_release(state: dict[str, Any]) -> None:
    RAN["examples"] += 1
    handler = Warnings()
    logging.getLogger("warmgate").addHandler(handler)
    with tempfile.TemporaryDirectory() as tmp:
        directory, outside = Path(tmp) / "state", Path(tmp) / "outside.json"
        directory.mkdir()
        outside.write_text('{"version": 1, "starts": [5.0], "stages": {}}')
        planted = {}
        paths = {key: directory / f"t.{key}.json" for key in KEYS}
        paths["budget"] = directory / "budget.json"
        for key, (kind, what) in state.items():
            if kind != "missing":
                planted[key] = plant(directory, outside, paths[key], kind, what)
        try:
            with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0.0)) as run:
                run.run(scenario(directory, planted, handler))
        finally:
            logging.getLogger("warmgate").removeHandler(handler)
    for key, path in paths.items():
        said = [line for line in handler.lines if str(path) in line and "ignoring" in line]
        assert len(said) <= 1, (key, said)
        RAN["refused"] += len(said)
