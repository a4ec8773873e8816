"""The replay on its virtual clock: cold starts and waits, keep_warm, auto, and the command."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from router.cli import main
from router.config import parse_config
from router.simulate.backends import Duration, MemoryStore
from router.simulate.report import summarize
from router.simulate.run import Options, replay
from router.simulate.trace import parse

OPTIONS = Options(cold_start={"*": Duration(30.0, 30.0)}, stop=Duration(1.0, 1.0), tail=600.0)


def _config(**scaling: Any) -> dict[str, Any]:
    return {
        "targets": {
            "t": {
                "routes": [{"path_prefix": "/"}],
                "backend": {"kind": "process", "command": ["true"], "port": 1},
                "scaling": {"idle_after": "5m", **scaling},
            }
        }
    }


def _bursts(gaps: list[float]) -> str:
    lines, t = ["time,target,kind,work_seconds"], 3600.0
    for gap in gaps:
        for i in range(3):
            lines.append(f"{t + i * 20},t,render,5")
        t += 40 + gap
    return "\n".join(lines)


def test_cold_starts_waits_and_gpu_hours() -> None:
    trace = parse(_bursts([200.0, 2000.0, 0.0]))  # the second gap outlasts idle_after: 5m
    result = replay(parse_config(_config()), trace, OPTIONS)
    record = result.targets["t"]
    assert record.cold_starts == 2
    assert [p for _, p in record.phases[1:5]] == ["starting", "ready", "draining", "cold"]
    summary = summarize(result)
    assert summary.cold_requests == 4 and summary.wait_max == 30.0  # two per cold start
    assert 0 < summary.gpu_hours_busy < summary.gpu_hours_held
    assert summary.total_usd == summary.gpu_usd + summary.wait_usd


def test_auto_learns_from_the_gaps() -> None:
    trace = parse(_bursts([400.0] * 12 + [20_000.0, 0.0]))
    result = replay(parse_config(_config(idle_after="auto")), trace, OPTIONS)
    record = result.targets["t"]
    assert record.learned and 400.0 <= record.idle_after < 600.0
    assert record.cold_starts == 2  # the first, and after the long gap only


def test_the_idleness_before_the_first_use_is_no_gap() -> None:
    trace = parse(_bursts([400.0, 400.0, 0.0]))  # the first request 1 h after the start
    result = replay(parse_config(_config(idle_after="auto")), trace, OPTIONS)
    assert result.targets["t"].gaps == 2


def test_what_was_learned_is_kept_for_the_next_replay() -> None:
    config = parse_config(_config(idle_after="auto"))
    week = parse(_bursts([400.0] * 12 + [0.0]))
    day = parse(_bursts([2000.0, 0.0]))  # a gap a fixed upper bound (1h) keeps through
    assert replay(config, day, OPTIONS).targets["t"].cold_starts == 1  # nothing learned yet
    store = MemoryStore()
    options = dataclasses.replace(OPTIONS, stores={"t": store})
    replay(config, week, options)
    assert store.documents["idle"]["gaps"] == 12 and store.documents["cold-start"]
    record = replay(config, day, options).targets["t"]
    assert record.learned and record.cold_starts == 2  # released within the 2000 s gap


def test_keep_warm_starts_ahead_and_never_releases() -> None:
    trace = parse("time,target,kind,work_seconds\n36000,t,render,5\n")  # Monday 10:00 UTC
    config = parse_config(_config(keep_warm=["Mon 09:00-12:00"]))
    result = replay(config, trace, Options(cold_start=OPTIONS.cold_start, tail=4 * 3600.0))
    phases = result.targets["t"].phases
    (started, _), (ready, _) = phases[1:3]
    assert started < ready <= 9 * 3600.0  # started a cold start ahead: warm when it opens
    assert [p for _, p in phases[1:]] == ["starting", "ready", "draining", "cold"]
    assert phases[3][0] == 12 * 3600.0  # released once the window ended (idle long enough)
    assert not any(o.cold for o in result.outcomes)


def test_the_command_compares_and_draws(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(_config()))
    (tmp_path / "day.csv").write_text(_bursts([200.0, 2000.0, 0.0]))
    out = tmp_path / "out"
    code = main(
        [
            "simulate",
            "--config",
            str(tmp_path / "w.yaml"),
            "--trace",
            str(tmp_path / "day.csv"),
            "--set",
            "targets.*.scaling.idle_after=1h",
            "--auto",
            "--cold-start",
            "30s",
            "--tail",
            "10m",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    shown = capsys.readouterr().out
    assert "idle_after=auto" in shown and "total cost" in shown
    assert (out / "summary.csv").read_text().count("\n") == 3
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "cost.png").stat().st_size > 0


def test_a_bad_trace_is_one_line(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(_config()))
    (tmp_path / "day.csv").write_text("time,target,kind,work_seconds\n0,t,sing,1\n")
    code = main(["simulate", "-c", str(tmp_path / "w.yaml"), "-t", str(tmp_path / "day.csv")])
    assert code == 2
    assert "line 2, field 'kind'" in capsys.readouterr().err
