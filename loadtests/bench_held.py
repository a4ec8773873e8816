"""Section "held": RSS per request while N slow requests are held open at once."""

from __future__ import annotations

import statistics
import time
from typing import Any

from loadtests.contenders import Contender, Stack, stack
from loadtests.harness import (
    PYTHON,
    Ctx,
    Goal,
    SectionResult,
    held_row,
    http_get,
    http_json,
    raise_nofile,
    rss_kb,
    section,
    wrk,
)

HOLD_CAP_S = 120  # /slow?s=: the upstream answers on /_release long before this
RAMP_TIMEOUT_S = 90.0
KB_GOAL = 10.0


def sample_rss(pid: int) -> float:
    samples = []
    for _ in range(3):
        samples.append(rss_kb(pid))
        time.sleep(0.2)
    return statistics.median(samples)


def upstream_held(st: Stack) -> int:
    return int(http_json(st.upstream.port, "/_stats")["held"])


def hold(ctx: Ctx, st: Stack, c: Contender, n: int) -> dict[str, Any]:
    wrk(c.url("/small"), 16, 1, ctx.load_cpus)  # warm-up: lazy imports, first pools
    time.sleep(1.0)
    before, out = sample_rss(c.pid), ctx.workdir / f"held-{c.name}.json"
    client = st.procs.start(
        f"held-{c.name}",
        [
            PYTHON,
            "-m",
            "loadtests.held_client",
            "--url",
            c.url(f"/slow?s={HOLD_CAP_S}"),
            "-n",
            str(n),
            "--out",
            str(out),
        ],
        cpus=ctx.load_cpus,
    )
    t0 = time.monotonic()
    while time.monotonic() - t0 < RAMP_TIMEOUT_S and client.poll() is None:
        if upstream_held(st) >= n:
            break
        time.sleep(0.2)
    ramp = time.monotonic() - t0
    time.sleep(1.0)  # let the proxy finish allocating for the last arrivals
    held, during = upstream_held(st), sample_rss(c.pid)
    http_get(st.upstream.port, "/_release", timeout=30)
    client.wait(timeout=120)
    st.procs.stop(f"held-{c.name}")
    return held_row(n, held, out, ramp, before, during)


def render(rows: dict[str, dict[str, Any]], skipped: dict[str, str]) -> str:
    out = [
        "| contender | held at upstream | answered 200 | RSS before | RSS held | KB/held "
        "| ramp | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        kb = "n/a" if r["kb_per_held"] is None else f"{r['kb_per_held']:.2f}"
        out.append(
            f"| {name} | {r['held']}/{r['n']} | {r['ok']}/{r['n']} | "
            f"{r['rss_before_mb']} MB | {r['rss_held_mb']} MB | {kb} | {r['ramp_s']}s | "
            f"{r['errors'] or '-'} |"
        )
    out += ["", "RSS includes child processes (nginx master + worker). direct = the upstream.", ""]
    return "\n".join(out + [f"skipped: {k}: {v}" for k, v in skipped.items()])


@section("held")
def run(ctx: Ctx) -> SectionResult:
    n = ctx.opts.held
    hard = raise_nofile(2 * n + 1024)  # the proxy holds a client and an upstream socket each
    if hard < 2 * n + 1024:
        n = max(100, (hard - 1024) // 2)
        ctx.log(f"!! holding only {n} requests")
    rows: dict[str, dict[str, Any]] = {}
    with stack(ctx) as st:
        for c in st.contenders:
            rows[c.name] = r = hold(ctx, st, c, n)
            ctx.log(
                f"  {c.name:9} held {r['held']}/{n} answered {r['ok']}/{n} "
                f"KB/held {r['kb_per_held']} (ramp {r['ramp_s']}s)"
            )
        skipped = st.skipped
    wg = rows.get("warmgate", {})
    kb = wg.get("kb_per_held")
    ok = None if kb is None else kb <= KB_GOAL and wg["ok"] == wg["n"] == wg["held"]
    goals = [
        Goal(
            f"warmgate KB RSS per held request ({n} held, all answered)",
            kb,
            f"<= {KB_GOAL:g} KB",
            ok,
        )
    ]
    return SectionResult(render(rows, skipped), {"rows": rows, "skipped": skipped}, goals)
