"""Section "simulate": warmgate simulate on the generated traces (loadtests/traces/generate.py),
a fixed idle_after swept against idle_after: auto, side by side; and the replay's speed.

    python -m loadtests.bench --section simulate [--quick]

One target (a 60 s cold start, a 5 s stop, economics: at its defaults) per shape: office,
evening, hobby (seed 1). Every fixed value of router.simulate.variants.SWEEP is replayed, and
auto; the best fixed value is the cheapest in hindsight. Replays run in parallel processes.
Goals: on the office trace auto holds >= 30% fewer idle GPU-hours than a fixed 30m with no more
requests meeting a cold start; on every shape auto's total cost is within 10% of the best fixed;
a day of 10,000 requests (the busy shape) replays in under 10 s on one core.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtests.harness import Ctx, Goal, SectionResult, section
from loadtests.traces.generate import generate
from router.simulate.backends import Duration
from router.simulate.report import Summary, summarize
from router.simulate.run import Options, replay
from router.simulate.trace import DEFAULT_START, Trace
from router.simulate.variants import SWEEP, Variant, auto_idle, fixed_idle, variant

CONFIG = """\
targets:
  comfyui:
    engine: comfyui
    routes: [{path_prefix: /}]
    backend: {kind: process, command: ["true"], port: 8188}
"""
SHAPES = ("office", "evening", "hobby")
OPTIONS = Options(cold_start={"*": Duration(60.0, 60.0)}, stop=Duration(5.0, 5.0))


def _trace(shape: str) -> Trace:
    return Trace(tuple(generate(shape, seed=1)), DEFAULT_START.timestamp(), shape)


def _one(path: str, shape: str, idle: float | None) -> Summary:
    base = variant(path, [])
    chosen: Variant = auto_idle(base) if idle is None else fixed_idle(base, idle)
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
    jobs = [(shape, idle) for shape in SHAPES for idle in (*SWEEP, None)]
    summaries: dict[tuple[str, float | None], Summary] = {}
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    began = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        futures = {pool.submit(_one, str(path), shape, idle): (shape, idle) for shape, idle in jobs}
        speed = pool.submit(_speed, str(path))
        for future in concurrent.futures.as_completed(futures):
            summaries[futures[future]] = future.result()
        cpu_seconds, requests = speed.result()
    ctx.log(f"   {len(jobs)} replays in {time.monotonic() - began:.0f}s on {workers} processes")
    return _report(summaries, cpu_seconds, requests)


def _report(
    summaries: dict[tuple[str, float | None], Summary], cpu_seconds: float, requests: int
) -> SectionResult:
    goals: list[Goal] = []
    lines = ["### simulate: fixed idle_after vs auto on the generated traces", ""]
    data: dict[str, Any] = {"speed": {"requests": requests, "cpu_seconds": cpu_seconds}}
    for shape in SHAPES:
        fixed = {idle: summaries[(shape, idle)] for idle in SWEEP}
        auto, thirty = summaries[(shape, None)], fixed[1800.0]
        best_idle = min(fixed, key=lambda idle: fixed[idle].total_usd)
        best = fixed[best_idle]
        ratio = auto.total_usd / best.total_usd if best.total_usd else 1.0
        goals.append(Goal(f"{shape}: auto cost / best fixed", ratio, "<= 1.10", ratio <= 1.10))
        if shape == "office":
            saved = 1 - auto.gpu_hours_idle / thirty.gpu_hours_idle if thirty.gpu_hours_idle else 0
            no_more = auto.cold_requests <= thirty.cold_requests
            goals.append(
                Goal("office: idle GPU-hours saved vs 30m", saved, ">= 0.30", saved >= 0.30)
            )
            goals.append(
                Goal(
                    "office: requests meeting a cold start, auto - 30m",
                    float(auto.cold_requests - thirty.cold_requests),
                    "<= 0",
                    no_more,
                )
            )
        lines += [
            f"**{shape}** ({auto.requests} requests): best fixed in hindsight "
            f"idle_after={best.config.partition('=')[2]}",
            "",
            "| | 30m | auto | best fixed |",
            "|---|---|---|---|",
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
            lines.append(f"| {name} | {get(thirty)} | {get(auto)} | {get(best)} |")
        sweep = ", ".join(
            f"{s.config.partition('=')[2]} ${s.total_usd:.2f}" for s in fixed.values()
        )
        lines += ["", f"sweep: {sweep}", ""]
        data[shape] = {
            "auto": asdict(auto),
            "fixed": {str(k): asdict(v) for k, v in fixed.items()},
            "best_fixed": best_idle,
        }
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


if __name__ == "__main__":  # the section alone, without wrk and the proxy contenders
    import tempfile

    from loadtests.harness import Options as BenchOptions

    with tempfile.TemporaryDirectory() as tmp:
        result = run(Ctx(BenchOptions(), Path(tmp), None, None))
    print(result.markdown)
    for goal in result.goals:
        print(goal.line())
