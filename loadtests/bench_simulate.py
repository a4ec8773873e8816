"""Section "simulate": warmgate simulate on the generated traces (loadtests/traces/generate.py),
a fixed idle_after swept against idle_after: auto, side by side; the parked tier; and the
replay's speed.

    python -m loadtests.bench --section simulate [--quick]
    python -m loadtests.bench_simulate          (the section alone, printed)

One target (a 60 s cold start, a 5 s stop, economics: at its defaults) per shape: office (a
week of a lab of four), evening, hobby (seed 1). Every fixed value of
router.simulate.variants.SWEEP is replayed, and auto; the best fixed value is the cheapest in
hindsight. On the office trace the same target with the parked tier (a 2 s wake): park_after
5m with idle_after 30m, and both auto. Replays run in parallel processes.
Goals: on the office trace auto (a ComfyUI target parks, so idle_after and park_after both
auto) holds >= 30% fewer idle GPU-hours (the weights on the card, nothing running) than the fixed
30m it replaces, with no more requests meeting a cold start; on every shape auto's total cost is
within 10% of the best fixed; a day of 10,000 requests (the busy shape) replays in under 10 s on
one core. Beside the first goal, the same figures for idle_after: auto without the parked tier,
and what any policy without it could save with 30m's cold starts, knowing every gap in advance:
releasing at once instead of after 30 minutes at each gap 30m releases in.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtests.harness import Ctx, Goal, SectionResult, section
from loadtests.traces.generate import generate
from router.simulate.backends import Duration, MemoryStore
from router.simulate.report import Summary, summarize
from router.simulate.run import Options, replay
from router.simulate.trace import DEFAULT_START, Trace
from router.simulate.variants import SWEEP, auto_idle, fixed_idle, variant

CONFIG = """\
targets:
  comfyui:
    engine: comfyui
    routes: [{path_prefix: /}]
    backend: {kind: process, command: ["true"], port: 8188}
"""
SHAPES = ("office", "evening", "hobby")
OPTIONS = Options(
    cold_start={"*": Duration(60.0, 60.0)},
    stop=Duration(5.0, 5.0),
    wake={"*": Duration(2.0, 2.0)},
)
WARM = "learned before"
PARKED = (("park_after=5m", "5m", "30m"), ("park_after=auto", "auto", "auto"))
"""The parked tier on the office trace: (label, park_after, idle_after)."""


def _trace(shape: str, seed: int = 1) -> Trace:
    return Trace(tuple(generate(shape, seed=seed)), DEFAULT_START.timestamp(), shape)


def _warm(path: str, shape: str) -> Summary:
    """auto on the trace, with what it learned from the one before (seed 2) kept, as the state
    store keeps it across restarts."""
    chosen = auto_idle(variant(path, []))
    options = dataclasses.replace(OPTIONS, stores={"comfyui": MemoryStore()})
    replay(chosen.config, _trace(shape, seed=2), options, chosen.label)
    return summarize(replay(chosen.config, _trace(shape), options, "auto, learned before"))


def _one(path: str, shape: str, idle: float | str | None) -> Summary:
    if idle == WARM:
        return _warm(path, shape)
    if isinstance(idle, str):  # the parked tier
        label, park_after, idle_after = next(p for p in PARKED if p[0] == idle)
        sets = [f"targets.*.scaling.park_after={park_after}"]
        sets.append(f"targets.*.scaling.idle_after={idle_after}")
        chosen = variant(path, sets, label)
    else:
        base = variant(path, [])
        chosen = auto_idle(base) if idle is None else fixed_idle(base, idle)
    return summarize(replay(chosen.config, _trace(shape), OPTIONS, chosen.label))


def _speed(path: str) -> tuple[float, int]:
    trace = Trace(tuple(generate("busy", seed=1)), DEFAULT_START.timestamp(), "busy")
    config = fixed_idle(variant(path, []), 1800.0).config
    began = time.process_time()
    replay(config, trace, Options(tail=0.0))
    return time.process_time() - began, len(trace.requests)


@section("simulate")
def run(ctx: Ctx) -> SectionResult:
    path = ctx.workdir / "simulate.yaml"
    path.write_text(CONFIG)
    jobs: list[tuple[str, float | str | None]] = [
        (shape, idle) for shape in SHAPES for idle in (*SWEEP, None, WARM)
    ]
    jobs += [("office", label) for label, _, _ in PARKED]
    summaries: dict[tuple[str, float | str | None], Summary] = {}
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    began = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        futures = {pool.submit(_one, str(path), shape, idle): (shape, idle) for shape, idle in jobs}
        for future in concurrent.futures.as_completed(futures):
            summaries[futures[future]] = future.result()
    ctx.log(f"   {len(jobs)} replays in {time.monotonic() - began:.0f}s on {workers} processes")
    with concurrent.futures.ProcessPoolExecutor(1) as pool:  # alone: one core's speed
        cpu_seconds, requests = pool.submit(_speed, str(path)).result()
    return _report(summaries, cpu_seconds, requests)


def _report(
    summaries: dict[tuple[str, float | str | None], Summary], cpu_seconds: float, requests: int
) -> SectionResult:
    goals: list[Goal] = []
    lines = ["### simulate: fixed idle_after vs auto on the generated traces", ""]
    data: dict[str, Any] = {"speed": {"requests": requests, "cpu_seconds": cpu_seconds}}
    for shape in SHAPES:
        fixed = {idle: summaries[(shape, float(idle))] for idle in SWEEP}
        auto, thirty = summaries[(shape, None)], fixed[1800.0]
        best_idle = min(fixed, key=lambda idle: fixed[idle].total_usd)
        best = fixed[best_idle]
        ratio = auto.total_usd / best.total_usd if best.total_usd else 1.0
        goals.append(Goal(f"{shape}: auto cost / best fixed", ratio, "<= 1.10", ratio <= 1.10))
        warm = summaries[(shape, WARM)]
        steady = warm.total_usd / best.total_usd if best.total_usd else 1.0
        goals.append(Goal(f"{shape}: the same, learned the week before", steady, "-", None))
        if shape == "office":
            goals += _office_goals(thirty, auto, summaries[("office", PARKED[-1][0])])
            data["office_bound"] = _bound(thirty)
        lines += [
            f"**{shape}** ({auto.requests} requests): best fixed in hindsight "
            f"idle_after={best.config.partition('=')[2]}",
            "",
            "| | 30m | auto | auto, learned before | best fixed |",
            "|---|---|---|---|---|",
        ]
        for name, get in (
            ("GPU-hours held", lambda s: f"{s.gpu_hours_held:.2f}"),
            ("idle GPU-hours", lambda s: f"{s.gpu_hours_idle:.2f}"),
            ("cold starts", lambda s: str(s.cold_starts)),
            ("requests that met one", lambda s: str(s.cold_requests)),
            (
                "wait p50/p95/max (s)",
                lambda s: f"{s.wait_p50:.0f}/{s.wait_p95:.0f}/{s.wait_max:.0f}",
            ),
            ("total cost", lambda s: f"${s.total_usd:.2f}"),
            ("idle_after at the end", lambda s: s.idle_after),
        ):
            cells = " | ".join(get(s) for s in (thirty, auto, warm, best))
            lines.append(f"| {name} | {cells} |")
        sweep = ", ".join(
            f"{s.config.partition('=')[2]} ${s.total_usd:.2f}" for s in fixed.values()
        )
        lines += [
            "",
            f"sweep: {sweep}",
            "",
            "(auto, learned before: the same trace after the one of seed 2, the histogram and "
            "the cold starts kept as the state store keeps them across restarts.)",
            "",
        ]
        if shape == "office":
            lines += [
                f"Releasing at once at each of the {thirty.cold_starts} gaps 30m releases in "
                f"(knowing them in advance) would save {_bound(thirty):.0%} of its idle "
                "GPU-hours with its cold starts: the most any policy without the parked tier "
                "saves without cutting a gap 30m keeps warm.",
                "",
            ]
            lines += _parked(thirty, [summaries[("office", label)] for label, _, _ in PARKED])
        data[shape] = {
            "auto": asdict(auto),
            "auto_learned_before": asdict(warm),
            "fixed": {str(k): asdict(v) for k, v in fixed.items()},
            "best_fixed": best_idle,
        }
    parked = {label: asdict(summaries[("office", label)]) for label, _, _ in PARKED}
    data["office_parked"] = parked
    goals.append(
        Goal(
            f"a day of {requests} requests replays in (CPU s)",
            cpu_seconds,
            "< 10",
            cpu_seconds < 10,
        )
    )
    lines.append(f"A day of {requests} requests (busy shape) replayed in {cpu_seconds:.1f} CPU s.")
    return SectionResult("\n".join(lines), data, goals)


def _saved(thirty: Summary, other: Summary) -> float:
    """The share of 30m's idle GPU-hours (weights on the card, nothing running) ``other`` does
    without."""
    return 1 - other.gpu_hours_idle / thirty.gpu_hours_idle if thirty.gpu_hours_idle else 0.0


def _bound(thirty: Summary) -> float:
    """Releasing at once, instead of after 30 minutes, at each gap 30m releases in."""
    return thirty.cold_starts * 0.5 / thirty.gpu_hours_idle if thirty.gpu_hours_idle else 0.0


def _office_goals(thirty: Summary, single: Summary, parked: Summary) -> list[Goal]:
    """The office goal for the target as ``auto`` runs it (a ComfyUI target parks: idle_after
    and park_after both auto) against the fixed 30m it replaces; beside it, idle_after: auto
    without the parked tier and the most any policy without it could save."""
    saved = _saved(thirty, parked)
    more = float(parked.cold_requests - thirty.cold_requests)
    return [
        Goal("office: idle GPU-hours saved, auto (parked) vs 30m", saved, ">= 0.30", saved >= 0.30),
        Goal("office: requests meeting a cold start, auto (parked) - 30m", more, "<= 0", more <= 0),
        Goal("office: the same saved, idle_after: auto alone", _saved(thirty, single), "-", None),
        Goal(
            "office: requests meeting a cold start, idle_after: auto alone - 30m",
            float(single.cold_requests - thirty.cold_requests),
            "-",
            None,
        ),
        Goal(
            "office: most saved without the parked tier with 30m's starts",
            _bound(thirty),
            "-",
            None,
        ),
    ]


def _parked(thirty: Summary, parked: list[Summary]) -> list[str]:
    """The office trace with the parked tier, beside 30m without it."""
    lines = [
        "**office with the parked tier** (a 2 s wake; a parked hour at economics' parked_hour_usd)",
        "",
        "| | 30m | " + " | ".join(s.config for s in parked) + " |",
        "|---|" + "---|" * (1 + len(parked)),
    ]
    for name, get in (
        ("GPU-hours held (parked)", lambda s: f"{s.gpu_hours_held:.2f} ({s.gpu_hours_parked:.2f})"),
        ("idle GPU-hours", lambda s: f"{s.gpu_hours_idle:.2f}"),
        ("cold starts / requests met", lambda s: f"{s.cold_starts} / {s.cold_requests}"),
        ("wakes / requests met", lambda s: f"{s.wakes} / {s.wake_requests}"),
        ("total cost", lambda s: f"${s.total_usd:.2f}"),
        ("idle_after / park_after at the end", lambda s: f"{s.idle_after} / {s.park_after}"),
    ):
        lines.append(f"| {name} | {get(thirty)} | " + " | ".join(get(s) for s in parked) + " |")
    return [*lines, ""]


if __name__ == "__main__":  # the section alone, without wrk and the proxy contenders
    import tempfile

    from loadtests.harness import Options as BenchOptions

    with tempfile.TemporaryDirectory() as tmp:
        result = run(Ctx(BenchOptions(), Path(tmp), None, None))
    print(result.markdown)
    for goal in result.goals:
        print(goal.line())
