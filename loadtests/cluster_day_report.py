"""The day's figures per policy (from tests/kube/dayrun.Day), the markdown tables beside
``warmgate simulate``'s prediction, and the picture: one row per GPU over the day, per policy."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.simulate.report import percentile
from tests.kube.day import NODES, UIS
from tests.kube.dayrun import Day

HOUR = 3600.0


@dataclass(frozen=True)
class Figures:
    policy: str
    compression: float
    batch_useful_h: float
    """Useful batch GPU-hours of the day (uncompressed: measured seconds x compression)."""
    batch_lost_h: float
    ui_held_h: float
    """GPU-hours held by the render pods (the GPU ledger: starting, ready, draining)."""
    ui_idle_h: float
    """GPU-hours the render targets were ready with nothing to do (warmgate's accounting)."""
    free_h: float
    """GPU-hours nobody held."""
    total_h: float
    cold_starts: int
    preempting: int
    """Cold starts that waited while the scheduler evicted a batch pod."""
    cold_start_mean: float
    """Seconds from scale-up to ready (measured, not compressed)."""
    met_cold: int
    requests: int
    lost: int
    lost_why: str
    ui_waits: tuple[float, float, float]
    """p50 / p95 / max seconds to the UI (a page), as measured."""
    render_waits: tuple[float, float, float]
    """p50 / p95 / max seconds to a render's first byte, as measured."""


def _waits(values: Sequence[float]) -> tuple[float, float, float]:
    return (percentile(values, 50), percentile(values, 95), max(values, default=0.0))


def figures(day: Day) -> Figures:
    c = day.lab.compression
    useful, lost = day.batch_seconds()
    span = day.ended - day.began
    gpus = sum(g for _, g in NODES)
    free = sum(to - fro for _, _, fro, to in day.free_gaps())
    starts = day.metric("warmgate_cold_start_seconds_count")
    lost_met = [m for m in day.met if m.lost is not None]
    return Figures(
        policy=day.lab.policy,
        compression=c,
        batch_useful_h=useful * c / HOUR,
        batch_lost_h=lost * c / HOUR,
        ui_held_h=day.ui_seconds() * c / HOUR,
        ui_idle_h=day.metric("warmgate_gpu_seconds_total.idle") * c / HOUR,
        free_h=free * c / HOUR,
        total_h=gpus * span * c / HOUR,
        cold_starts=int(day.metric("warmgate_cold_starts_total")),
        preempting=int(day.metric("warmgate_cold_start_stage_seconds_count.preempting")),
        cold_start_mean=day.metric("warmgate_cold_start_seconds_sum") / starts if starts else 0.0,
        met_cold=sum(m.cold for m in day.met),
        requests=len(day.met),
        lost=len(lost_met),
        lost_why="; ".join(sorted({m.lost or "" for m in lost_met}))[:200],
        ui_waits=_waits([m.wait for m in day.met if m.kind == "page" and m.lost is None]),
        render_waits=_waits([m.wait for m in day.met if m.kind == "render" and m.lost is None]),
    )


NAMES = {
    "always": "always on",
    "fixed": "fixed 30 min, no preemption",
    "warmgate": "warmgate (auto, preempts)",
}


def _w(w: tuple[float, float, float]) -> str:
    return f"{w[0]:.1f} / {w[1]:.1f} / {w[2]:.1f}"


def _err(measured: float, predicted: float) -> str:
    if measured == 0:
        return "-" if predicted == 0 else "n/a (0 measured)"
    return f"{(predicted - measured) / measured * 100:+.0f}%"


def tables(
    results: Sequence[Figures], sims: Mapping[str, Mapping[str, Any]], compression: float, n: int
) -> str:
    head = "| | " + " | ".join(NAMES.get(f.policy, f.policy) for f in results) + " |"
    rule = "|---|" + "---|" * len(results)
    rows: list[tuple[str, Any]] = [
        ("batch useful GPU-hours", lambda f: f"{f.batch_useful_h:.2f}"),
        ("batch GPU-hours lost to preemption", lambda f: f"{f.batch_lost_h:.2f}"),
        ("GPU-hours held by UIs", lambda f: f"{f.ui_held_h:.2f}"),
        ("  of them ready and idle", lambda f: f"{f.ui_idle_h:.2f}"),
        ("GPU-hours held by nobody", lambda f: f"{f.free_h:.2f}"),
        ("GPU-hours in all", lambda f: f"{f.total_h:.2f}"),
        ("cold starts (of them preempting batch)", lambda f: f"{f.cold_starts} ({f.preempting})"),
        ("cold start, mean s (measured)", lambda f: f"{f.cold_start_mean:.1f}"),
        ("requests that met a cold start", lambda f: f"{f.met_cold} of {f.requests}"),
        ("to the UI p50 / p95 / max s", lambda f: _w(f.ui_waits)),
        ("to a render's first byte p50 / p95 / max s", lambda f: _w(f.render_waits)),
        ("requests lost", lambda f: str(f.lost) + (f" ({f.lost_why})" if f.lost else "")),
    ]
    out = [
        f"# A day of contention on a real scheduler ({n} requests, {compression:g}x compressed)",
        "",
        "Measured on the test cluster (kube-scheduler, a 4-GPU box and a 1-GPU workstation, a "
        "batch Job at priority `batch`); GPU-hours are of the day (measured x compression), "
        "waits are seconds as measured (a cold start is not compressed).",
        "",
        head,
        rule,
    ]
    out += [f"| {name} | " + " | ".join(cell(f) for f in results) + " |" for name, cell in rows]
    out += ["", "## `warmgate simulate` on the same trace and configuration", ""]
    out += [
        "| | " + " | ".join(NAMES.get(f.policy, f.policy) for f in results) + " |",
        rule,
    ]
    pairs = [
        ("idle GPU-hours", lambda f: f.ui_idle_h, "gpu_hours_idle"),
        ("GPU-hours held", lambda f: f.ui_held_h, "gpu_hours_held"),
        ("cold starts", lambda f: float(f.cold_starts), "cold_starts"),
        ("requests that met one", lambda f: float(f.met_cold), "cold_requests"),
    ]
    for name, measured, column in pairs:
        cells = []
        for f in results:
            sim = sims.get(f.policy) or {}
            if "error" in sim or column not in sim:
                cells.append(f"simulate failed: {sim.get('error', '?')}")
                continue
            m, p = measured(f), float(sim[column])
            cells.append(f"{m:.2f} measured, {p:.2f} predicted ({_err(m, p)})")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", _goals(results), ""]
    return "\n".join(out)


def _goals(results: Sequence[Figures]) -> str:
    by = {f.policy: f for f in results}
    a, b, c = by.get("always"), by.get("fixed"), by.get("warmgate")
    lines = ["## The goals", ""]
    if a and c:
        back = c.batch_useful_h - a.batch_useful_h
        unused = a.ui_idle_h
        share = back / unused * 100 if unused else 0.0
        lines.append(
            f"- batch got back {back:.2f} of the {unused:.2f} GPU-hours always-on UIs held idle "
            f"({share:.0f}%; goal 90%)"
        )
    if b and c:
        more = (c.batch_useful_h / b.batch_useful_h - 1) * 100 if b.batch_useful_h else 0.0
        lines.append(
            f"- useful batch GPU-hours against the fixed 30 minutes: {more:+.0f}% (goal +20%)"
        )
        lines.append(
            f"- cold starts met by people: {c.met_cold} against {b.met_cold} (goal: no more)"
        )
    if c:
        lines.append(
            f"- p95 wait to the UI: {c.ui_waits[1]:.1f} s against a cold start of "
            f"{c.cold_start_mean:.1f} s (goal: within the cold start + 2 s); lost: {c.lost}"
        )
    return "\n".join(lines)


COLORS = {"comfyui": "#d9480f", "wan2gp": "#5f3dc4", "trainer": "#2b8a3e"}
IDLE = {"comfyui": "#ffc9a9", "wan2gp": "#d0bfff"}


def svg(days: Mapping[str, Day]) -> str:
    """One panel per policy, one row per GPU: batch (green), a UI busy (dark) or idle (light)
    or starting (grey), free (white)."""
    width, row, left, gap = 900, 14, 170, 34
    rows = [(n, g) for n, count in NODES for g in range(count)]
    height = 30 + len(days) * (len(rows) * row + gap) + 20
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 20}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        '<text x="10" y="16">Each GPU over the day: batch (green), image UI busy / idle (orange '
        "/ light), video UI busy / idle (purple / light), starting (grey), free (white)</text>",
    ]
    y = 30
    for policy, day in days.items():
        span = max(day.ended - day.began, 1e-6)

        def x(t: float, day: Day = day, span: float = span) -> float:
            return left + (min(max(t, day.began), day.ended) - day.began) / span * (width - left)

        out.append(
            f'<text x="10" y="{y + 10}" font-weight="bold">{NAMES.get(policy, policy)}</text>'
        )
        y += 14
        for i, (node, gpu) in enumerate(rows):
            top = y + i * row
            out.append(f'<text x="10" y="{top + 10}">{node} gpu{gpu}</text>')
            out.append(
                f'<rect x="{left}" y="{top}" width="{width - left}" height="{row - 2}" '
                'fill="white" stroke="#ccc"/>'
            )
            for h in day.held():
                if h.node != node or h.gpu != gpu:
                    continue
                on, off = x(h.on), x(h.off or day.ended)
                if off <= on:
                    continue
                color = COLORS.get(h.app, "#868e96")
                out.append(
                    f'<rect x="{on:.1f}" y="{top}" width="{off - on:.1f}" height="{row - 2}" '
                    f'fill="{color}"/>'
                )
                if h.app in UIS:
                    out += _ui_states(day, h.app, h.on, h.off or day.ended, top, row, x)
        y += len(rows) * row + gap
    out.append("</svg>")
    return "\n".join(out)


def _ui_states(
    day: Day, target: str, on: float, off: float, top: int, row: int, x: Any
) -> list[str]:
    """Over a UI's own bar: light where warmgate saw it ready and idle, grey while starting."""
    out = []
    samples = [s for s in day.samples if s.target == target and on <= s.t <= off]
    for s, nxt in itertools.pairwise(samples):
        fill = None
        if s.phase == "starting":
            fill = "#adb5bd"
        elif s.phase in ("ready", "draining") and not s.busy:
            fill = IDLE.get(target)
        if fill:
            a, b = x(s.t), x(nxt.t)
            out.append(
                f'<rect x="{a:.1f}" y="{top}" width="{max(b - a, 0.3):.1f}" height="{row - 2}" '
                f'fill="{fill}"/>'
            )
    return out
