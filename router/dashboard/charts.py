"""The dashboard's pictures, drawn on the server as SVG from the view (``/status``'s JSON): each
target's strip of phases over the day and the last hour with the cold starts and wakes requests
met, each GPU pool's occupancy, today's GPU-hours stacked, the waits for a cold start as a
histogram, and each model's cloud spend over the day against the budget. Pure functions of the
view: no script is needed to read them, and the page's script swaps them in as they change."""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Json = Mapping[str, Any]

WIDTH = 720
"""The drawing's width in SVG units (scaled to the card by the stylesheet)."""
LEFT = 4

COLOURS = {
    "cold": "#d5d9df",
    "starting": "#f2b134",
    "starting:scheduling": "#f7d58b",
    "starting:unschedulable": "#e0663c",
    "starting:preempting": "#e8873c",
    "starting:pulling": "#f5c25a",
    "starting:starting": "#f2b134",
    "starting:loading": "#df9a1c",
    "starting:waking": "#c79ad6",
    "busy": "#2e8b57",
    "idle": "#9fd4b4",
    "parked": "#6f93c4",
    "draining": "#b3a0d6",
    "failed": "#d9534f",
    "unknown": "#f4f4f4",
}
"""Fill of each label of the strip (a stage not listed takes its phase's)."""
LEGEND = ("cold", "starting", "busy", "idle", "parked", "draining", "failed", "unknown")
HOURS_ORDER = ("busy", "idle", "parked", "starting")
WAIT_BUCKETS = ((10, "<10s"), (30, "10-30s"), (60, "30-60s"), (120, "1-2m"), (300, "2-5m"))
"""Upper bounds (seconds) and names of the histogram's bars; the last bar is what is longer."""
LINE_COLOURS = ("#3b6fb6", "#c0504d", "#9bbb59", "#8064a2", "#4bacc6", "#f79646")


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def colour(label: str) -> str:
    return COLOURS.get(label) or COLOURS.get(label.split(":", 1)[0], "#cccccc")


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M", time.gmtime(epoch))


def _x(t: float, since: float, until: float, width: float = WIDTH - 2 * LEFT) -> float:
    return LEFT + width * (t - since) / (until - since) if until > since else LEFT


def spans(
    segments: Sequence[Sequence[Any]], since: float, until: float
) -> Iterable[tuple[float, float, str]]:
    """(start, end, label) of the strip clipped to [since, until]."""
    for i, (at, label) in enumerate(segments):
        end = segments[i + 1][0] if i + 1 < len(segments) else until
        start, end = max(float(at), since), min(float(end), until)
        if end > start:
            yield start, end, str(label)


def _ticks(since: float, until: float, step: float, y: float) -> str:
    first = (since // step + 1) * step
    out = []
    t = first
    while t < until:
        x = _x(t, since, until)
        out.append(
            f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{y - 10}" stroke="#0003"/>'
            f'<text x="{x:.1f}" y="{y}" font-size="9" text-anchor="middle">{_clock(t)}</text>'
        )
        t += step
    return "".join(out)


def strip(name: str, timeline: Json, since: float, until: float, scope: str) -> str:
    """One target's phases in [since, until] (``scope``: ``day`` or ``hour``), marks above."""
    height, bar_y, bar_h = 46, 12, 20
    rects = []
    for start, end, label in spans(timeline["segments"], since, until):
        x0, x1 = _x(start, since, until), _x(end, since, until)
        rects.append(
            f'<rect class="seg" data-label="{e(label)}" x="{x0:.2f}" y="{bar_y}" '
            f'width="{max(0.3, x1 - x0):.2f}" height="{bar_h}" fill="{colour(label)}">'
            f"<title>{e(label)} {_clock(start)}-{_clock(end)} UTC</title></rect>"
        )
    marks = []
    for m in timeline["marks"]:
        if not since <= m["at"] <= until:
            continue
        x = _x(m["at"], since, until)
        took = f", ready after {m['seconds']:.0f}s" if m["seconds"] is not None else ""
        fill = "#d9534f" if m["kind"] == "cold start" else "#7a4fa0"
        marks.append(
            f'<path class="mark" data-kind="{e(m["kind"])}" d="M{x:.1f} 10 l-4 -8 h8 z" '
            f'fill="{fill}"><title>{e(m["kind"])} at {_clock(m["at"])} UTC, '
            f"{m['held']} held{took}</title></path>"
        )
    step = 3 * 3600 if scope == "day" else 600
    label = "last 24 h" if scope == "day" else "last hour"
    return (
        f'<svg class="strip {scope}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="{e(name)}: phases, {label}" data-target="{e(name)}">'
        f'<rect x="{LEFT}" y="{bar_y}" width="{WIDTH - 2 * LEFT}" height="{bar_h}" '
        f'fill="#fff" stroke="#0002"/>{"".join(rects)}{"".join(marks)}'
        f"{_ticks(since, until, step, height - 2)}</svg>"
    )


RESIDENT = ("starting", "busy", "idle", "draining")


def occupancy(
    pool: str, capacity: int, timelines: Sequence[Json], since: float, until: float
) -> str:
    """How many of the pool's members held its GPUs over [since, until], a step line under
    its capacity."""
    changes: list[tuple[float, int]] = []
    for timeline in timelines:
        was = False
        for start, _end, label in spans(timeline["segments"], since, until):
            now = label.split(":", 1)[0] in RESIDENT
            if now != was:
                changes.append((start, 1 if now else -1))
                was = now
    changes.sort()
    height, top, bottom = 54, 6, 40
    scale = max(capacity, 1)
    points, count = [f"{LEFT},{bottom}"], 0
    for at, delta in changes:
        x = _x(at, since, until)
        points.append(f"{x:.1f},{bottom - (bottom - top) * count / scale:.1f}")
        count += delta
        points.append(f"{x:.1f},{bottom - (bottom - top) * count / scale:.1f}")
    points.append(f"{WIDTH - LEFT},{bottom - (bottom - top) * count / scale:.1f}")
    cap_y = top
    return (
        f'<svg class="occupancy" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="pool {e(pool)}: GPUs held, last 24 h" data-pool="{e(pool)}">'
        f'<line x1="{LEFT}" y1="{cap_y}" x2="{WIDTH - LEFT}" y2="{cap_y}" stroke="#d9534f" '
        f'stroke-dasharray="4 3"><title>capacity {capacity}</title></line>'
        f'<polyline points="{" ".join(points)}" fill="none" stroke="#3b6fb6" stroke-width="1.5">'
        f"<title>GPUs held now: {count} of {capacity}</title></polyline>"
        f"{_ticks(since, until, 3 * 3600, height - 2)}</svg>"
    )


def legend() -> str:
    items = "".join(
        f'<li><svg viewBox="0 0 10 10" width="10" height="10"><rect width="10" height="10" '
        f'fill="{colour(label)}" stroke="#0003"/></svg> {e(label)}</li>'
        for label in LEGEND
    )
    marks = (
        '<li><span style="color:#d9534f">▼</span> cold start met by requests</li>'
        '<li><span style="color:#7a4fa0">▼</span> wake met by requests</li>'
    )
    return f'<ul class="legend">{items}{marks}</ul>'


def gpu_hours(targets: Mapping[str, Json]) -> str:
    """Today's GPU-hours per target, stacked by what for (busy, idle, parked, starting)."""
    rows = [(name, t["gpu_hours_today"]) for name, t in targets.items()]
    top = max((sum(h.get(k, 0.0) for k in HOURS_ORDER) for _, h in rows), default=0.0)
    row_h, label_w = 22, 120
    height = row_h * len(rows) + 16
    width = WIDTH - label_w - 60
    out = []
    for i, (name, hours) in enumerate(rows):
        y = 4 + i * row_h
        x = float(label_w)
        out.append(f'<text x="0" y="{y + 13}" font-size="11">{e(name)}</text>')
        for key in HOURS_ORDER:
            value = hours.get(key, 0.0)
            w = width * value / top if top else 0.0
            if w > 0:
                out.append(
                    f'<rect class="hours" data-target="{e(name)}" data-kind="{key}" x="{x:.1f}" '
                    f'y="{y}" width="{w:.1f}" height="{row_h - 6}" fill="{colour(key)}">'
                    f"<title>{e(name)}: {value:.2f} GPU-h {key}</title></rect>"
                )
            x += w
        total = sum(hours.get(k, 0.0) for k in HOURS_ORDER)
        out.append(f'<text x="{x + 4:.1f}" y="{y + 13}" font-size="10">{total:.2f} h</text>')
    return (
        f'<svg class="gpu-hours" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="GPU-hours today per target">{"".join(out)}</svg>'
    )


def wait_counts(waits: Iterable[float]) -> list[tuple[str, int]]:
    names = [name for _, name in WAIT_BUCKETS] + [f">{WAIT_BUCKETS[-1][1].split('-')[-1]}"]
    counts = [0] * len(names)
    for w in waits:
        i = next((i for i, (bound, _) in enumerate(WAIT_BUCKETS) if w < bound), len(names) - 1)
        counts[i] += 1
    return list(zip(names, counts, strict=True))


def waits_histogram(targets: Mapping[str, Json]) -> str:
    """The waits for a cold start or a wake that requests met today, all targets together."""
    counts = wait_counts(w for t in targets.values() for w in t["waits_today"])
    top = max((n for _, n in counts), default=0)
    height, bottom, bar_w = 110, 88, (WIDTH / 2 - 20) / len(counts)
    out = []
    for i, (name, n) in enumerate(counts):
        h = (bottom - 14) * n / top if top else 0.0
        x = 10 + i * bar_w
        out.append(
            f'<rect class="wait" data-bucket="{e(name)}" data-count="{n}" x="{x:.1f}" '
            f'y="{bottom - h:.1f}" width="{bar_w - 6:.1f}" height="{h:.1f}" fill="#f2b134">'
            f"<title>{n} waits {e(name)}</title></rect>"
            f'<text x="{x + (bar_w - 6) / 2:.1f}" y="{bottom + 12}" font-size="10" '
            f'text-anchor="middle">{e(name)}</text>'
            f'<text x="{x + (bar_w - 6) / 2:.1f}" y="{bottom - h - 3:.1f}" font-size="10" '
            f'text-anchor="middle">{n}</text>'
        )
    return (
        f'<svg class="waits" viewBox="0 0 {WIDTH // 2} {height}" role="img" '
        f'aria-label="waits for a cold start or wake today">{"".join(out)}</svg>'
    )


def spend(lines: Mapping[str, Sequence[Sequence[float]]], limit: float, since: float,
          until: float) -> str:  # fmt: skip
    """Each model's cloud spend over the day, cumulative, under the day's budget."""
    height, top, bottom = 120, 8, 100
    peak = max([limit, *(p[1] for line in lines.values() for p in line)], default=0.0) or 1.0

    def y(usd: float) -> float:
        return bottom - (bottom - top) * usd / peak

    out = [
        f'<line class="budget" x1="{LEFT}" y1="{y(limit):.1f}" x2="{WIDTH - LEFT}" '
        f'y2="{y(limit):.1f}" stroke="#d9534f" stroke-dasharray="5 3">'
        f"<title>budget ${limit:,.2f}</title></line>"
        f'<text x="{WIDTH - LEFT}" y="{y(limit) - 3:.1f}" font-size="10" text-anchor="end">'
        f"budget ${limit:,.2f}</text>"
    ]
    for i, (model, line) in enumerate(sorted(lines.items())):
        c = LINE_COLOURS[i % len(LINE_COLOURS)]
        points = [f"{LEFT},{bottom}"]
        last = 0.0
        for at, usd in line:
            if at < since:
                continue
            x = _x(at, since, until)
            points += [f"{x:.1f},{y(last):.1f}", f"{x:.1f},{y(usd):.1f}"]
            last = usd
        points.append(f"{_x(until, since, until):.1f},{y(last):.1f}")
        out.append(
            f'<polyline class="spend" data-model="{e(model)}" points="{" ".join(points)}" '
            f'fill="none" stroke="{c}" stroke-width="1.5"><title>{e(model)}: ${last:,.4f}'
            f"</title></polyline>"
            f'<text x="{LEFT + 4}" y="{top + 12 + 12 * i}" font-size="10" fill="{c}">'
            f"{e(model)} ${last:,.4f}</text>"
        )
    return (
        f'<svg class="spend-chart" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="cloud spend per model today against the budget">{"".join(out)}'
        f"{_ticks(since, until, 3 * 3600, height - 2)}</svg>"
    )
