"""A trace of one's own on ``make cluster-day``: its targets are replayed on the day's two UIs."""

from __future__ import annotations

from loadtests.cluster_day import engine_work, fit_targets
from router.simulate.trace import Request


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
