"""The parked tier and GPU pools in the replay: parks after park_after, wakes that take the wake
time the config or the command line gives, GPU-hours parked and their price, a full pool's
displacements and waits, and park_after: auto learned in the replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.cli import main
from router.config import parse_config
from router.simulate.backends import Duration, measured_wakes
from router.simulate.report import summarize
from router.simulate.run import Options, replay, wake_for
from router.simulate.trace import parse
from router.simulate.variants import auto_idle, variant

OPTIONS = Options(cold_start={"*": Duration(30.0, 30.0)}, stop=Duration(5.0, 5.0), tail=600.0)


def _target(engine: str = "comfyui", path: str = "/", **scaling: Any) -> dict[str, Any]:
    return {
        "engine": engine,
        "routes": [{"path_prefix": path}],
        "backend": {"kind": "process", "command": ["true"], "port": 1},
        "scaling": {"idle_after": "30m", "park_after": "5m", **scaling},
    }


def _trace(*rows: tuple[float, str]) -> str:
    return "time,target,kind,work_seconds\n" + "".join(f"{at},{t},render,5\n" for at, t in rows)


def test_parks_after_park_after_and_wakes_in_the_configured_wake() -> None:
    config = parse_config({"targets": {"t": _target(expected_wake="3s")}})
    trace = parse(_trace((3600, "t"), (3620, "t"), (4400, "t"), (4410, "t")))
    result = replay(config, trace, OPTIONS)
    record = result.targets["t"]
    phases = [p for _, p in record.phases]
    assert phases == ["cold", "starting", "ready", "parked", "ready", "parked"]
    # ready at 3630, two renders of 5 s, then idle for park_after: 5m
    assert record.phases[3][0] == pytest.approx(3640 + 300, abs=2.0)
    assert (record.parks, record.wakes, record.cold_starts) == (2, 1, 1)
    woken = [o for o in result.outcomes if o.met == "wake"]
    assert len(woken) == 1 and woken[0].waited == pytest.approx(3.0)
    summary = summarize(result)
    assert summary.wake_requests == 1 and summary.wake_max == pytest.approx(3.0)
    assert summary.cold_requests == 2  # the first start, met by both of its renders
    assert summary.gpu_hours_parked > 0.15
    economics = config.economics  # parked hours at their own price
    held = summary.gpu_hours_held - summary.gpu_hours_parked
    assert summary.gpu_usd == pytest.approx(
        held * economics.gpu_hour_usd + summary.gpu_hours_parked * economics.parked_hour_usd
    )
    assert summary.park_after == "t=5m"


def test_the_wake_given_on_the_command_line_wins(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "w.yaml").write_text(yaml.safe_dump({"targets": {"t": _target()}}))
    (tmp_path / "day.csv").write_text(_trace((3600, "t"), (4400, "t")))
    code = main(
        [
            "simulate",
            "-c",
            str(tmp_path / "w.yaml"),
            "-t",
            str(tmp_path / "day.csv"),
            "--cold-start",
            "30s",
            "--wake",
            "t=7s",
            "--tail",
            "10m",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    shown = capsys.readouterr().out
    assert "parks / wakes" in shown and "7.0s / 7.0s / 7.0s" in shown
    header, row = (tmp_path / "out" / "summary.csv").read_text().splitlines()
    assert dict(zip(header.split(","), row.split(","), strict=True))["wake_max"] == "7.0"


def _kept_wakes(tmp: Path, *wakes: float) -> Path:
    """A config whose state_dir holds the wakes ``warmgate serve`` kept for ``t``."""
    (tmp / "state").mkdir()
    (tmp / "state" / "t.wake.json").write_text(json.dumps({"version": 1, "wakes": list(wakes)}))
    data = {"state_dir": "state", "targets": {"t": _target(expected_wake="3s")}}
    (tmp / "w.yaml").write_text(yaml.safe_dump(data))
    (tmp / "day.csv").write_text(_trace((3600, "t"), (4400, "t"), (5200, "t")))
    return tmp / "w.yaml"


def _simulate(tmp: Path, *given: str) -> dict[str, str]:
    code = main(
        ["simulate", "-c", str(tmp / "w.yaml"), "-t", str(tmp / "day.csv"), "--cold-start",
         "30s", "--tail", "10m", "--out", str(tmp / "out"), *given]
    )  # fmt: skip
    assert code == 0
    header, row = (tmp / "out" / "summary.csv").read_text().splitlines()
    return dict(zip(header.split(","), row.split(","), strict=True))


def test_the_wakes_warmgate_serve_kept_are_replayed(tmp_path: Path, capsys: Any) -> None:
    _kept_wakes(tmp_path, 6.0, 8.0, 7.0)
    summary = _simulate(tmp_path)
    shown, told = capsys.readouterr()
    assert f"t: a wake takes 6s..8s as measured (3 kept in {tmp_path / 'state'}" in told
    assert summary["wakes"] == "2"
    assert 6.0 <= float(summary["wake_p50"]) <= float(summary["wake_max"]) <= 8.0  # not 3 s
    waits = (float(summary[k]) for k in ("wake_p50", "wake_p95", "wake_max"))
    assert " / ".join(f"{w:.1f}s" for w in waits) in shown  # the table's wait for a wake

    summary = _simulate(tmp_path, "--wake", "t=1s")  # the command line wins
    assert "a wake takes" not in capsys.readouterr().err
    assert summary["wake_max"] == "1.0"


def test_a_replays_wake_is_the_given_then_the_measured_then_the_expected(tmp_path: Path) -> None:
    config = parse_config(yaml.safe_load(_kept_wakes(tmp_path, 4.0, 5.0).read_text()),
                          str(tmp_path / "w.yaml"), str(tmp_path))  # fmt: skip
    measured = measured_wakes(config)
    assert measured["t"].duration == Duration(4.0, 5.0) and measured["t"].starts == 2
    kept = Options(measured_wake={"t": measured["t"].duration})
    assert wake_for("t", config, kept) == Duration(4.0, 5.0)
    given = Options(wake={"*": Duration(9.0, 9.0)}, measured_wake=kept.measured_wake)
    assert wake_for("t", config, given) == Duration(9.0, 9.0)
    assert wake_for("t", config, Options()) == Duration(3.0, 3.0)  # scaling.expected_wake
    (tmp_path / "state" / "t.wake.json").write_text('{"version": 1, "wakes": [4.0, "x"]}')
    assert measured_wakes(config) == {}


def test_a_full_pool_displaces_the_idle_one_and_the_newcomer_waits_for_it() -> None:
    config = parse_config(
        {
            "pools": {"ws": {"capacity": 1, "yield_after": "30s"}},
            "targets": {
                "comfy": {**_target(path="/c", expected_wake="2s"), "pool": "ws"},
                "wan": {**_target("gradio", "/w", park_after=0), "pool": "ws"},
            },
        }
    )
    # wan comes while comfy idles (parked to make room); comfy comes back (wan stopped)
    trace = parse(_trace((3600, "comfy"), (3700, "wan"), (3720, "wan"), (3800, "comfy")))
    result = replay(config, trace, OPTIONS)
    comfy, wan = result.targets["comfy"], result.targets["wan"]
    assert [p for _, p in comfy.phases[:5]] == ["cold", "starting", "ready", "parked", "ready"]
    assert [p for _, p in wan.phases] == ["cold", "starting", "ready", "draining", "cold"]
    assert comfy.phases[3][0] == 3700.0 and wan.phases[1][0] == pytest.approx(3701.0)
    assert (comfy.displaced, wan.displaced) == (1, 1)  # parked for wan; wan stopped for comfy
    assert (comfy.pool_waits, wan.pool_waits) == (1, 1)
    back = [o for o in result.outcomes if o.request.at == 3800]
    assert back[0].met == "wake" and back[0].waited == pytest.approx(5.0 + 2.0)  # stop, wake
    summary = summarize(result)
    assert (summary.displaced, summary.pool_waits) == (2, 2)
    # never two resident at once on the one GPU of the pool
    spans = {name: record.phases for name, record in result.targets.items()}
    for at in range(3600, 4400, 5):
        resident = [n for n, ph in spans.items() if _phase_at(ph, at) in ("starting", "ready")]
        assert len(resident) <= 1, (at, resident)


def _phase_at(phases: list[tuple[float, str]], at: float) -> str:
    current = "cold"
    for when, phase in phases:
        if when <= at:
            current = phase
    return current


def test_park_after_auto_is_learned_in_the_replay(tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text(yaml.safe_dump({"targets": {"t": _target()}}))
    rows, t = [], 3600.0
    for _ in range(12):  # bursts with 8-minute pauses: a wake is cheap, the GPU is not
        rows += [(t, "t"), (t + 20, "t")]
        t += 25 + 480
    base = variant(tmp_path / "w.yaml", [])
    auto = auto_idle(base)
    assert auto.label == "idle_after=auto park_after=auto"
    scaling = auto.config.targets["t"].scaling
    assert scaling.idle_auto and scaling.park_auto
    result = replay(auto.config, parse(_trace(*rows)), OPTIONS)
    record = result.targets["t"]
    assert record.learned
    assert 120.0 <= record.park_after < 480.0 < record.idle_after  # parked, never stopped
    assert record.cold_starts == 1 and record.wakes >= 8
