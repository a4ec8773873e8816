"""Section "proxy": wrk req/s and p50/p99 per contender x body size x connections."""

from __future__ import annotations

import math

from loadtests.contenders import Contender, stack
from loadtests.harness import Ctx, Goal, SectionResult, WrkResult, pin, section, wrk

SIZES = {"small": "/small", "large": "/large"}  # 200 B, 1 MiB
BASELINE = {"small": "minimal", "large": "nginx"}  # what each size's ratios are against

Cells = dict[str, dict[str, dict[int, WrkResult]]]  # size -> contender -> connections


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs and min(xs) > 0 else None


def ratios(cells: Cells, size: str, name: str, conns: tuple[int, ...]) -> list[float] | None:
    base, mine = cells.get(size, {}).get(BASELINE[size]), cells.get(size, {}).get(name)
    if not base or not mine:
        return None
    return [mine[n].rps / base[n].rps for n in conns if n in mine and n in base]


def render(cells: Cells, conns: tuple[int, ...], skipped: dict[str, str]) -> str:
    head = "| contender | " + " | ".join(f"c={n}" for n in conns) + " |"
    rule = "|---" * (len(conns) + 1) + "|"
    out = []
    for size, by_name in cells.items():
        out += [f"### {size} ({SIZES[size]}): req/s (p50/p99)", "", head, rule]
        out += [
            f"| {name} | " + " | ".join(r[n].cell() if n in r else "-" for n in conns) + " |"
            for name, r in by_name.items()
        ]
        out += ["", f"ratio vs {BASELINE[size]} (req/s):", "", head + " geomean |", rule + "---|"]
        for name in by_name:
            rs = ratios(cells, size, name, conns)
            if rs:
                gm = geomean(rs)
                gm_s = f"{gm:.2f}x" if gm else "-"
                out.append(f"| {name} | " + " | ".join(f"{r:.2f}x" for r in rs) + f" | {gm_s} |")
        out.append("")
    out += [f"skipped: {name}: {why}" for name, why in skipped.items()]
    return "\n".join(out)


def goal(cells: Cells, size: str, conns: tuple[int, ...]) -> Goal:
    rs = ratios(cells, size, "warmgate", conns)
    gm = geomean(rs) if rs else None
    return Goal(
        f"warmgate / {BASELINE[size]} req/s, {size} (geomean over c)",
        gm,
        ">= 1.0x",
        None if gm is None else gm >= 1.0,
    )


def measure(ctx: Ctx, c: Contender, direct: bool, url: str, n: int) -> WrkResult:
    if direct:  # the upstream itself is under test: give it the proxies' CPU
        pin(c.pid, ctx.proxy_cpus)
    try:
        wrk(url, n, ctx.opts.warmup, ctx.load_cpus)
        return wrk(url, n, ctx.opts.duration, ctx.load_cpus)
    finally:
        if direct:
            pin(c.pid, ctx.load_cpus)


@section("proxy")
def run(ctx: Ctx) -> SectionResult:
    o = ctx.opts
    cells: Cells = {}
    with stack(ctx) as st:
        # contenders interleaved per cell, so drifting background load hits them all alike
        for size, path in SIZES.items():
            for n in o.connections:
                for c in st.contenders:
                    r = measure(ctx, c, c is st.upstream, c.url(path), n)
                    ctx.log(f"  {c.name:9} {size:5} c={n:<4} {r.cell()}")
                    cells.setdefault(size, {}).setdefault(c.name, {})[n] = r
        skipped = st.skipped
    data = {
        size: {name: {str(n): vars(r) for n, r in rs.items()} for name, rs in by.items()}
        for size, by in cells.items()
    }
    return SectionResult(
        render(cells, o.connections, skipped),
        {"cells": data, "skipped": skipped},
        [goal(cells, "small", o.connections), goal(cells, "large", o.connections)],
    )
