"""``make cluster-day`` without a cluster: a trace of one's own on the day's two UIs, and the
picture drawn from the ledgers kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from loadtests.cluster_day import engine_work, fit_targets
from loadtests.cluster_day_report import svg
from router.simulate.trace import Request
from tests.kube.day import DayLab
from tests.kube.dayrun import Day


def _r(at: float, target: str | None, kind: str = "render", model: str | None = None) -> Request:
    return Request(at, target, model, kind, 1.0, 0, False, 0)


def test_the_days_own_targets_are_kept() -> None:
    trace = [_r(0, "comfyui"), _r(1, "wan2gp", "page")]
    fitted, mapping = fit_targets(trace)
    assert fitted == trace
    assert mapping == {}


def test_other_targets_take_the_uis_busiest_first() -> None:
    trace = [_r(0, "ltx"), _r(1, "flux"), _r(2, "flux"), _r(3, "sdxl"), _r(4, None, "api", "m")]
    fitted, mapping = fit_targets(trace)
    assert mapping == {"flux": "comfyui", "ltx": "wan2gp", "sdxl": "wan2gp", "m": "wan2gp"}
    assert [r.target for r in fitted] == ["wan2gp", "comfyui", "comfyui", "wan2gp", "wan2gp"]
    assert [r.at for r in fitted] == [0, 1, 2, 3, 4]


def test_a_target_the_day_has_keeps_its_ui_beside_others() -> None:
    fitted, mapping = fit_targets([_r(0, "wan2gp"), _r(1, "flux")])
    assert mapping == {"flux": "comfyui"}
    assert [r.target for r in fitted] == ["wan2gp", "comfyui"]


def test_renders_take_their_uis_render_time() -> None:
    fitted, _ = fit_targets([_r(100, "flux"), _r(130, "ltx", "page")])
    work = engine_work(fitted)
    assert [r.work_seconds for r in work] == [12.0, 1.0]
    assert work[0].at == 60.0  # a lead of the batch queue at work before the first request


def test_the_picture_is_drawn_after_the_labs_folder_is_gone(tmp_path: Path) -> None:
    """make cluster-day draws its picture once each policy's folder (and ledgers) is removed."""
    lab = DayLab(None, None, "day", tmp_path, "warmgate", 60.0)  # type: ignore[arg-type]
    gpus = [
        {"node": "gpu-box", "gpu": 0, "pod": "trainer-a", "app": "trainer", "event": "on", "t": 1},
        {"node": "gpu-box", "gpu": 0, "pod": "trainer-a", "app": "trainer", "event": "off", "t": 5},
        {"node": "gpu-box", "gpu": 0, "pod": "comfyui-b", "app": "comfyui", "event": "on", "t": 6},
    ]
    lab.gpu_ledger.write_text("".join(json.dumps(e) + "\n" for e in gpus))
    lab.batch_ledger.write_text(json.dumps({"t0": 1, "t1": 4, "useful": True}) + "\n")
    day = Day(lab, began=0.0, ended=10.0)
    day.keep_ledgers()
    shutil.rmtree(tmp_path)
    assert [(h.app, h.on, h.off) for h in day.held()] == [("trainer", 1, 5), ("comfyui", 6, None)]
    assert day.batch_seconds() == (3.0, 0.0)
    picture = svg({"warmgate": day})
    assert picture.count('fill="white" stroke="#ccc"') == 5  # a row per GPU
    assert picture.count("<rect") == 1 + 5 + 2  # the page, the rows, the two holds


def test_a_gap_counts_only_while_a_batch_pod_waited(tmp_path: Path) -> None:
    """A GPU free while the Job holds back its next pod (its failure backoff) is not a GPU
    left free while batch waited: only the seconds a batch pod was pending count."""
    lab = DayLab(None, None, "day", tmp_path, "warmgate", 60.0)  # type: ignore[arg-type]
    day = Day(lab, began=0.0, ended=30.0)
    day.pending = [(0.0, 1), (2.0, 0), (10.0, 2), (12.0, 1), (20.0, 0)]
    assert day.waited(0.0, 30.0) == 12.0  # 0-2 and 10-20
    assert day.waited(5.0, 11.0) == 1.0
    assert day.waited(20.0, 30.0) == 0.0
    day.pending.append((25.0, 1))
    assert day.waited(20.0, 30.0) == 5.0  # still pending when the day ended
