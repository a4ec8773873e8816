"""A day of contention on a real scheduler (``make cluster-day``): the same compressed day of
people replayed through warmgate on a fresh test cluster for each policy (tests/kube/day.py:
always on, a fixed 30 minutes without preemption, warmgate's own), what each gave the batch
queue and what the people waited, and ``warmgate simulate``'s prediction beside it.

    python -m loadtests.cluster_day [--compression 120] [--policies always,fixed,warmgate] \
        [--trace day.csv] [--out loadtests/results]

Without ``--trace`` the day is the office day (loadtests/traces/office.py, a lab of four on the
image UI ``comfyui``) and one bursty evening (one creator on the video UI ``wan2gp``), seed 1.
A trace of your own may name the targets ``comfyui`` and ``wan2gp``; any other target it names is
replayed on one of them (fit_targets: the busiest on a UI it leaves free, the rest on the video
UI). Writes ``cluster-day.md`` (tables), ``cluster-day.svg`` (one row per GPU over the day, per
policy) and the trace replayed (``cluster-day-trace.csv``) to ``--out``.
Needs the control plane (``make kube-bins``)."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtests.cluster_day_report import Figures, figures, svg, tables
from loadtests.traces.generate import generate
from router.simulate.trace import DEFAULT_START, Request, read, write
from tests.kube import netns
from tests.kube.cluster import KubeBinaries, KubeCluster
from tests.kube.day import POLICIES, UIS, day_lab
from tests.kube.dayrun import Day, run_day

LEAD = 60.0
"""Seconds of the day replayed before its first request (the batch queue at work)."""


def default_trace(seed: int = 1) -> list[Request]:
    """The office day on the image UI and an evening on the video UI; each render's GPU time is
    the engine's (the demo engine renders in a fixed time per target, the simulator is told so)."""
    day = generate("office", seed, 1, "comfyui") + generate("evening", seed, 1, "wan2gp")
    return sorted(day, key=lambda r: r.at)


def fit_targets(trace: list[Request]) -> tuple[list[Request], dict[str, str]]:
    """The trace on the day's two UIs: a target named ``comfyui`` or ``wan2gp`` keeps its UI;
    the others (and requests naming none) take the UIs left, the busiest first, the rest
    sharing the video UI. Returns the trace and what each other target became."""
    names: dict[str, int] = {}
    for r in trace:
        name = r.target or r.model or "(none)"
        names[name] = names.get(name, 0) + 1
    left = [ui for ui in UIS if ui not in names]
    others = sorted((n for n in names if n not in UIS), key=lambda n: -names[n])
    fitted = {name: left[i] if i < len(left) else list(UIS)[-1] for i, name in enumerate(others)}
    return [
        r if r.target in UIS else replace(r, target=fitted[r.target or r.model or "(none)"])
        for r in trace
    ], fitted


def engine_work(trace: list[Request]) -> list[Request]:
    """The trace as the engines run it: a render takes its target's render time."""
    first = min(r.at for r in trace) - LEAD
    return [
        replace(r, at=round(r.at - first, 3), work_seconds=UIS.get(r.target or "", 0.3))
        if r.kind == "render"
        else replace(r, at=round(r.at - first, 3))
        for r in trace
    ]


async def one_policy(policy: str, trace: list[Request], compression: float, work: Path) -> Day:
    bins = KubeBinaries.find()
    if bins is None:
        raise SystemExit(f"{KubeBinaries.missing_in()}: run `make kube-bins`")
    cluster = await asyncio.to_thread(KubeCluster.start, bins, work / "kube")
    try:
        async with day_lab(cluster, work / "day", policy, compression) as lab:
            # The tail: the longest idle window (an hour) and a minute more, compressed.
            return await run_day(lab, trace, tail=(3600 + 60) / compression)
    finally:
        await asyncio.to_thread(cluster.stop)


def simulate(
    policy: str, trace: Path, cold_start: float, compression: float, work: Path
) -> dict[str, Any]:
    """``warmgate simulate`` on the day as warmgate runs it uncompressed (its summary line).

    The run's cold start of ``cold_start`` seconds held the GPU ``compression`` times as long in
    the day's time, while the people waited it as measured: the simulator is given the day's
    cold start and a second of waiting at ``1 / compression`` of the price, so that it weighs
    each gap as the run did (tests/kube/day.py prices the run's GPU time instead)."""
    from tests.kube.day import DayLab, economics  # a lab only for its configuration

    lab = DayLab(None, None, "day", work, policy, 1.0)  # type: ignore[arg-type]
    config = work / f"{policy}.yaml"
    settings = lab.config(Path("unused"))
    settings["economics"] = economics(1.0, wait_compression=1.0 / compression)
    config.write_text(json.dumps(settings))
    out = work / f"sim-{policy}"
    argv = [sys.executable, "-m", "router.cli", "simulate", "--config", str(config),
            "--trace", str(trace),
            "--cold-start", f"{max(cold_start * compression, 1.0):.1f}s",
            "--tail", "61m", "--out", str(out),
            # a cold start is long uncompressed: no hold times out that the run kept
            "--set", "targets.*.scaling.cold_start_timeout=6h"]  # fmt: skip
    if policy == "always":  # replicas 1 all day: warm before the first request
        argv += ["--set", 'targets.*.scaling.keep_warm=["00:00-23:59"]']
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip()[-300:]}
    with (out / "summary.csv").open() as handle:
        return next(csv.DictReader(handle))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--compression", type=float, default=120.0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--trace", type=Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("loadtests/results"))
    a = ap.parse_args(argv)
    # The pod network first, while this process has one thread (netns.py): from 1.21 an
    # EndpointSlice refuses the loopback addresses the pods would have otherwise.
    no_pod_network = netns.enter()
    bins = KubeBinaries.find()
    if bins is None:
        ap.error(f"{KubeBinaries.missing_in()}: run `make kube-bins`")
    if no_pod_network is not None and bins.version.at_least(1, 21):
        ap.error(f"Kubernetes {bins.version.text} needs the pod network: {no_pod_network}")
    policies = [p for p in a.policies.split(",") if p]
    unknown = set(policies) - set(POLICIES)
    if unknown:
        ap.error(f"unknown policies {sorted(unknown)}: choose from {', '.join(POLICIES)}")
    trace, fitted = fit_targets(list(read(a.trace).requests) if a.trace else default_trace(a.seed))
    for name, ui in fitted.items():
        print(f"the trace's {name!r} is replayed on {ui!r}", flush=True)
    trace = engine_work(trace)
    a.out.mkdir(parents=True, exist_ok=True)
    trace_file = a.out / "cluster-day-trace.csv"
    with trace_file.open("w") as handle:
        write(trace, DEFAULT_START.timestamp(), handle)
    results: list[Figures] = []
    sims: dict[str, dict[str, Any]] = {}
    days: dict[str, Day] = {}
    with tempfile.TemporaryDirectory(prefix="warmgate-day-") as tmp:
        for policy in policies:
            began = time.monotonic()
            print(f"{policy}: replaying {len(trace)} requests at {a.compression:g}x", flush=True)
            day = asyncio.run(one_policy(policy, trace, a.compression, Path(tmp) / policy))
            days[policy] = day
            f = figures(day)
            results.append(f)
            sims[policy] = simulate(
                policy, trace_file, f.cold_start_mean, a.compression, Path(tmp) / policy
            )
            print(f"{policy}: done in {time.monotonic() - began:.0f}s", flush=True)
    md = tables(results, sims, a.compression, len(trace))
    (a.out / "cluster-day.md").write_text(md)
    (a.out / "cluster-day.svg").write_text(svg(days))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
