"""Sections "wake" and "coldhold": scale from zero through a ``kind: process`` target.

wake: 20 cold starts back to back (idle_after 300 ms); per start, the engine (wake_engine.py)
records when it sent its first 200 on /readyz and when the first held request arrived. The
difference is the wake latency, "readiness observed -> first held request forwarded", measured
from outside warmgate; goal p99 <= 10 ms.

coldhold: N requests (default 5,000) held through one cold start whose readiness the bench
releases by creating a file: all must be answered; warmgate's own RSS while they are held
against before (the engine, warmgate's child, is not counted).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from loadtests.contenders import start_warmgate_config
from loadtests.harness import (
    PYTHON,
    ROOT,
    Ctx,
    Goal,
    Procs,
    SectionResult,
    StartError,
    held_row,
    http_get,
    http_json,
    raise_nofile,
    section,
)

WAKE_STARTS = 20
WAKE_GOAL_MS = 10.0
IDLE_AFTER = "300ms"
READY_AFTER_S = 0.2
HOLD_RAMP_TIMEOUT_S = 180.0


def _engine(ctx: Ctx, *args: str) -> str:
    """The engine's command; it moves itself to the load CPUs, as the upstream does elsewhere
    (warmgate's children inherit warmgate's CPU)."""
    argv = [PYTHON, "-m", "loadtests.wake_engine", "--port", "{port}", *args]
    if ctx.load_cpus:
        argv += ["--cpus", ",".join(map(str, sorted(ctx.load_cpus)))]
    return json.dumps(argv)


def _target(name: str, command: str, scaling: str) -> str:
    return f"""\
  {name}:
    engine: http
    routes: [{{path_prefix: /}}]
    backend: {{kind: process, command: {command}, cwd: "{ROOT}", stop_grace: 5s}}
    readiness: {{path: /readyz, interval: 20ms, timeout: 2s}}
    scaling: {scaling}
"""


def own_rss_kb(pid: int) -> float:
    """RSS of pid alone (not its children: the engine is warmgate's child)."""
    samples = []
    for _ in range(3):
        samples.append(psutil.Process(pid).memory_info().rss / 1024)
        time.sleep(0.2)
    return statistics.median(samples)


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: with 20 samples, p99 is the largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def phase(admin: int, target: str) -> dict[str, Any]:
    state: dict[str, Any] = http_json(admin, "/targets")[target]
    return state


def wait_phase(admin: int, target: str, want: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if phase(admin, target)["phase"] == want:
            return
        time.sleep(0.02)
    raise TimeoutError(f"{target} not {want} after {timeout:g}s: {phase(admin, target)}")


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------- wake latency
@section("wake")
def run_wake(ctx: Ctx) -> SectionResult:
    record = ctx.workdir / "wake-records.jsonl"
    command = _engine(ctx, "--ready-after", str(READY_AFTER_S), "--record", str(record))
    scaling = f"{{idle_after: {IDLE_AFTER}, cold_start_timeout: 60s}}"
    rows: list[dict[str, Any]] = []
    with Procs(ctx.workdir) as procs:
        try:
            port, admin = start_warmgate_config(
                ctx, procs, "wg-wake", _target("wake", command, scaling)
            )
            procs.wait_http("wg-wake", admin, "/healthz")
        except StartError as e:
            return SectionResult(f"skipped: {e}", {"skipped": str(e)}, [])
        for i in range(WAKE_STARTS + 1):  # the first is a warm-up (first use of every path)
            wait_phase(admin, "wake", "cold", 60)
            t0 = time.monotonic()
            status, _ = http_get(port, f"/work/{i}", timeout=60)
            total = time.monotonic() - t0
            if status != 200:
                raise RuntimeError(f"cold start {i}: HTTP {status}\n{procs.log_tail('wg-wake')}")
            rows.append({"total_s": total})
        wait_phase(admin, "wake", "cold", 60)
    recs = records(record)[1:]
    rows = rows[1:]
    lat = [(r["first_at"] - r["ready_at"]) * 1e3 for r in recs if r.get("ready_at") is not None]
    start_to_ready = [(r["ready_at"] - r["started"]) for r in recs if r.get("ready_at")]
    totals = [r["total_s"] for r in rows]
    p50 = statistics.median(lat) if lat else None
    p99 = percentile(lat, 99) if lat else None
    ctx.log(f"  wake latency over {len(lat)} cold starts: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    md = [
        f"{len(lat)} cold starts of a `kind: process` target, after one for warm-up (engine ready "
        f"{READY_AFTER_S:g}s after it starts, idle_after {IDLE_AFTER}, readiness probed every "
        "20 ms).",
        "",
        "| | p50 | p99 | max |",
        "|---|---|---|---|",
    ]
    if lat:
        md.append(
            f"| wake latency: engine's first 200 on /readyz -> first request arrives | "
            f"{p50:.2f} ms | {p99:.2f} ms | {max(lat):.2f} ms |"
        )
        md.append(
            f"| engine start -> ready (its own load time) | "
            f"{statistics.median(start_to_ready) * 1e3:.0f} ms | "
            f"{percentile(start_to_ready, 99) * 1e3:.0f} ms | {max(start_to_ready) * 1e3:.0f} ms |"
        )
    md.append(
        f"| client: request sent -> answered (the whole cold start) | "
        f"{statistics.median(totals) * 1e3:.0f} ms | {percentile(totals, 99) * 1e3:.0f} ms | "
        f"{max(totals) * 1e3:.0f} ms |"
    )
    data = {"wake_ms": lat, "total_s": totals, "start_to_ready_s": start_to_ready}
    goal = Goal(
        f"wake latency p99 over {len(lat)} cold starts (ms)",
        p99,
        f"<= {WAKE_GOAL_MS:g} ms",
        None if p99 is None else p99 <= WAKE_GOAL_MS and len(lat) == WAKE_STARTS,
    )
    return SectionResult("\n".join(md), data, [goal])


# ---------------------------------------------------------------- many held through one start
@section("coldhold")
def run_coldhold(ctx: Ctx) -> SectionResult:
    n = ctx.opts.held
    hard = raise_nofile(2 * n + 1024)
    if hard < 2 * n + 1024:
        n = max(100, (hard - 1024) // 2)
        ctx.log(f"!! holding only {n} requests")
    ready_file = ctx.workdir / "coldhold-ready"
    record = ctx.workdir / "coldhold-records.jsonl"
    command = _engine(ctx, "--ready-file", str(ready_file), "--record", str(record))
    scaling = f"{{idle_after: 1s, cold_start_timeout: 300s, max_held: {n + 100}}}"
    out = ctx.workdir / "coldhold-client.json"
    with Procs(ctx.workdir) as procs:
        try:
            port, admin = start_warmgate_config(
                ctx, procs, "wg-coldhold", _target("cold", command, scaling)
            )
            procs.wait_http("wg-coldhold", admin, "/healthz")
        except StartError as e:
            return SectionResult(f"skipped: {e}", {"skipped": str(e)}, [])
        pid = procs.procs["wg-coldhold"].pid
        # One full cycle first (imports, pools, the engine's first start), then cold again.
        ready_file.touch()
        for i in range(20):
            status, _ = http_get(port, f"/warm/{i}", timeout=60)
            if status != 200:
                raise RuntimeError(f"warm-up: HTTP {status}\n{procs.log_tail('wg-coldhold')}")
        ready_file.unlink()
        wait_phase(admin, "cold", "cold", 60)
        time.sleep(1.0)
        before = own_rss_kb(pid)
        client = procs.start(
            "coldhold-client",
            [PYTHON, "-m", "loadtests.held_client", "--url", f"http://127.0.0.1:{port}/job",
             "-n", str(n), "--timeout", "300", "--out", str(out)],
            cpus=ctx.load_cpus,
        )  # fmt: skip
        t0 = time.monotonic()
        held = 0
        while time.monotonic() - t0 < HOLD_RAMP_TIMEOUT_S and client.poll() is None:
            held = int(phase(admin, "cold")["held"])
            if held >= n:
                break
            time.sleep(0.2)
        ramp = time.monotonic() - t0
        time.sleep(1.0)  # let the last arrivals settle
        held = int(phase(admin, "cold")["held"])
        during = own_rss_kb(pid)
        released = time.monotonic()
        ready_file.touch()
        client.wait(timeout=300)
        answered_s = time.monotonic() - released
        procs.stop("coldhold-client")
    burst = [r for r in records(record) if r.get("ready_at") is not None][-1:]
    wake_ms = (burst[0]["first_at"] - burst[0]["ready_at"]) * 1e3 if burst else None
    row = {
        **held_row(n, held, out, ramp, before, during),
        "wake_ms": wake_ms and round(wake_ms, 2),
        "ready_to_all_answered_s": round(answered_s, 2),
    }
    kb = row["kb_per_held"]
    ctx.log(f"  coldhold: held {held}/{n}, answered {row['ok']}/{n}, KB/held {kb}")
    md = [
        "| held at warmgate | answered 200 | RSS before | RSS held | KB/held | wake (first "
        "forwarded) | ready -> all answered | ramp | errors |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {held}/{n} | {row['ok']}/{n} | {row['rss_before_mb']} MB | {row['rss_held_mb']} MB | "
        f"{'n/a' if kb is None else f'{kb:.2f}'} | "
        f"{'n/a' if wake_ms is None else f'{wake_ms:.1f} ms'} | {answered_s:.2f}s | "
        f"{row['ramp_s']}s | {row['errors'] or '-'} |",
        "",
        "RSS is warmgate's own (its engine child is not counted); held requests wait on the "
        "target's readiness, not on an upstream socket.",
    ]
    goal = Goal(
        f"requests held through one cold start, all answered ({n} held)",
        float(row["ok"]),
        f"== {n}",
        row["ok"] == n == held,
    )
    return SectionResult("\n".join(md), {"row": row}, [goal])
