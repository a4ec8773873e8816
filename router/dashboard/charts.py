"""The dashboard's pictures, drawn on the server as SVG from the view (``/status``'s JSON): each
target's strip of phases over the day and the last hour with the cold starts and wakes requests
met, each GPU pool's occupancy, today's GPU-hours stacked, the waits for a cold start as a
histogram, and each model's cloud spend over the day against the budget. Pure functions of the
view: no script is needed to read them, and the page's script swaps them in as they change.

An SVG scales with its card: its words would shrink with it (to 3 px on a phone). So the
drawings carry shapes only, and their words (the clock under a strip, names, values, legends)
are HTML beside them, placed by percent, at the page's own font size."""

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


def _tick_times(since: float, until: float, step: float) -> Iterable[float]:
    t = (since // step + 1) * step
    while t < until:
        yield t
        t += step


def _ticks(since: float, until: float, step: float, y: float) -> str:
    """The tick lines in a drawing (their clock is :func:`tick_labels`, under it)."""
    return "".join(
        f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{y:.1f}" stroke="#0003"/>'
        for x in (_x(t, since, until) for t in _tick_times(since, until, step))
    )


EDGE = 6.0
"""Percent of the width from an edge within which a tick's clock is aligned to its tick's
side rather than centred on it: centred, the first would be cut ("6:50" for 06:50)."""


def tick_labels(since: float, until: float, step: float) -> str:
    """The clock of each tick, as HTML under the drawing, placed by percent of its width."""
    spans = []
    for t in _tick_times(since, until, step):
        pct = 100 * _x(t, since, until) / WIDTH
        side = "start" if pct < EDGE else "end" if pct > 100 - EDGE else "mid"
        spans.append(f'<span class="{side}" style="left:{pct:.2f}%">{_clock(t)}</span>')
    return f'<div class="ticks">{"".join(spans)}</div>'


def strip(name: str, timeline: Json, since: float, until: float, scope: str) -> str:
    """One target's phases in [since, until] (``scope``: ``day`` or ``hour``), marks above."""
    height, bar_y, bar_h = 34, 12, 20
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
        f"{_ticks(since, until, step, height)}"
        f'<rect x="{LEFT}" y="{bar_y}" width="{WIDTH - 2 * LEFT}" height="{bar_h}" '
        f'fill="#fff" stroke="#0002"/>{"".join(rects)}{"".join(marks)}</svg>'
        f"{tick_labels(since, until, step)}"
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
    height, top, bottom = 44, 6, 40
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
        f"{_ticks(since, until, 3 * 3600, height)}"
        f'<line x1="{LEFT}" y1="{cap_y}" x2="{WIDTH - LEFT}" y2="{cap_y}" stroke="#d9534f" '
        f'stroke-dasharray="4 3"><title>capacity {capacity}</title></line>'
        f'<polyline points="{" ".join(points)}" fill="none" stroke="#3b6fb6" stroke-width="1.5">'
        f"<title>GPUs held now: {count} of {capacity}</title></polyline></svg>"
        f"{tick_labels(since, until, 3 * 3600)}"
    )


def swatch(fill: str) -> str:
    return (
        f'<svg viewBox="0 0 10 10" width="10" height="10"><rect width="10" height="10" '
        f'fill="{fill}" stroke="#0003"/></svg>'
    )


def legend() -> str:
    items = "".join(f"<li>{swatch(colour(label))} {e(label)}</li>" for label in LEGEND)
    marks = (
        f'<li><span style="color:{MARK_COLOURS["cold start"]}">▼</span> cold start met by '
        f'requests</li><li><span style="color:{MARK_COLOURS["wake"]}">▼</span> wake met by '
        "requests</li>"
    )
    return f'<ul class="legend">{items}{marks}</ul>'


def duration(seconds: float) -> str:
    """``7s``, ``1m12s``, ``2h05m``: a GPU time a person reads at a glance."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


HOURS_WORDS = {
    "busy": "busy",
    "idle": "idle (draining included)",
    "parked": "parked",
    "starting": "starting (and waking)",
}


def gpu_seconds(hours: Json) -> dict[str, float]:
    """A target's ``gpu_hours_today`` in seconds, by ``HOURS_ORDER``: what the card and the
    chart both show, so that their totals agree."""
    return {key: 3600 * float(hours.get(key, 0.0)) for key in HOURS_ORDER}


def gpu_hours(targets: Mapping[str, Json]) -> str:
    """Today's GPU time per target, stacked by what for (busy, idle, parked, starting), with
    a legend and each row's values in words."""
    rows = [(name, gpu_seconds(t["gpu_hours_today"])) for name, t in targets.items()]
    top = max((sum(seconds.values()) for _, seconds in rows), default=0.0)
    keys = "".join(f"<li>{swatch(colour(key))} {HOURS_WORDS[key]}</li>" for key in HOURS_ORDER)
    out = []
    for name, seconds in rows:
        x, rects = 0.0, []
        for key in HOURS_ORDER:
            value = seconds[key]
            w = 100 * value / top if top else 0.0
            if w > 0:
                rects.append(
                    f'<rect class="hours" data-target="{e(name)}" data-kind="{key}" '
                    f'x="{x:.2f}" y="0" width="{w:.2f}" height="10" fill="{colour(key)}">'
                    f"<title>{e(name)}: {duration(value)} {key}</title></rect>"
                )
            x += w
        said = " · ".join(f"{duration(seconds[k])} {k}" for k in HOURS_ORDER if seconds[k] >= 0.5)
        total = sum(seconds.values())
        out.append(
            f'<div class="hours-row" data-target="{e(name)}"><span class="name">{e(name)}</span>'
            f'<svg class="gpu-hours" viewBox="0 0 100 10" preserveAspectRatio="none" role="img" '
            f'aria-label="{e(name)}: GPU time today">{"".join(rects)}</svg>'
            f'<span class="values"><b>{duration(total)}</b>{": " + said if said else ""}'
            "</span></div>"
        )
    return f'<ul class="legend">{keys}</ul><div class="gpu-hours-chart">{"".join(out)}</div>'


WAIT_KINDS = ("cold start", "wake", "failed")
WAIT_COLOURS = {"cold start": "#f2b134", "wake": "#7a4fa0", "failed": "#d9534f"}
"""Fill of each kind of wait in the histogram (a wake in its mark's colour)."""
MARK_COLOURS = {"cold start": "#d9534f", "wake": "#7a4fa0"}


def wait_counts(waits: Iterable[float]) -> list[tuple[str, int]]:
    names = [name for _, name in WAIT_BUCKETS] + [f">{WAIT_BUCKETS[-1][1].split('-')[-1]}"]
    counts = [0] * len(names)
    for w in waits:
        i = next((i for i, (bound, _) in enumerate(WAIT_BUCKETS) if w < bound), len(names) - 1)
        counts[i] += 1
    return list(zip(names, counts, strict=True))


def waits_by_kind(targets: Mapping[str, Json]) -> dict[str, list[float]]:
    """Every target's waits today, by what ended them (``WAIT_KINDS``)."""
    out: dict[str, list[float]] = {kind: [] for kind in WAIT_KINDS}
    for t in targets.values():
        for kind, waits in (t.get("waits_today_by_kind") or {}).items():
            out.setdefault(kind, []).extend(waits)
    return out


def waits_histogram(targets: Mapping[str, Json]) -> str:
    """The waits requests met today, all targets together: bars stacked by kind (a cold start
    or a wake that ended ready, or one that failed), a legend with the counts of each."""
    by_kind = waits_by_kind(targets)
    counted = {kind: wait_counts(by_kind.get(kind, [])) for kind in WAIT_KINDS}
    names = [name for name, _ in counted[WAIT_KINDS[0]]]
    totals = [sum(counted[k][i][1] for k in WAIT_KINDS) for i in range(len(names))]
    top = max(totals, default=0)
    height, bar_w = 60, 100 / len(names)
    out = []
    for i, name in enumerate(names):
        y = float(height)
        for kind in WAIT_KINDS:
            n = counted[kind][i][1]
            if not n:
                continue
            h = (height - 2) * n / top
            y -= h
            out.append(
                f'<rect class="wait" data-bucket="{e(name)}" data-kind="{e(kind)}" '
                f'data-count="{n}" x="{i * bar_w + 1:.2f}" y="{y:.2f}" width="{bar_w - 2:.2f}" '
                f'height="{h:.2f}" fill="{WAIT_COLOURS[kind]}"><title>{n} waits {e(name)}, '
                f"{e(kind)}</title></rect>"
            )
    cells = "".join(
        f'<span><span class="n">{n}</span> {e(name)}</span>'
        for name, n in zip(names, totals, strict=True)
    )
    keys = "".join(
        f"<li>{swatch(WAIT_COLOURS[kind])} {e(kind)} {len(by_kind.get(kind, []))}</li>"
        for kind in WAIT_KINDS
    )
    return (
        f'<ul class="legend">{keys}</ul>'
        f'<svg class="waits" viewBox="0 0 100 {height}" preserveAspectRatio="none" role="img" '
        f'aria-label="waits for a cold start or wake today">{"".join(out)}</svg>'
        f'<div class="buckets">{cells}</div>'
    )


def day_section(v: Json) -> str:
    """The day in pictures: each target's strip (24 h and the last hour), each pool's
    occupancy, today's GPU-hours stacked and the waits requests met."""
    now, targets = v["now"], v["targets"]
    strips = "".join(
        f'<div class="timeline" id="timeline-{e(name)}"><h3>{e(name)} '
        f'<span class="phase">{e(t["phase"])}</span></h3>'
        f"{strip(name, t['timeline'], now - t['timeline']['window'], now, 'day')}"
        f'<details class="zoom" open><summary>last hour</summary>'
        f"{strip(name, t['timeline'], now - 3600, now, 'hour')}</details></div>"
        for name, t in targets.items()
    )
    pools = "".join(
        f'<div class="timeline pool-occupancy"><h3>pool {e(name)}: GPUs held '
        f"({len(p['resident'])} of {p['capacity']} now)</h3>"
        + occupancy(
            name,
            p["capacity"],
            [targets[m]["timeline"] for m in p["members"] if m in targets],
            now - 24 * 3600,
            now,
        )
        + "</div>"
        for name, p in (v.get("pools") or {}).items()
    )
    seconds = sum(sum(gpu_seconds(t["gpu_hours_today"]).values()) for t in targets.values())
    waits = sum(len(w) for w in waits_by_kind(targets).values())
    return (
        '<section id="day"><h2>The day</h2>'
        f'<div class="card wide">{legend()}{strips}{pools}</div>'
        '<div class="cards">'
        f'<div class="card hours"><h3>GPU time today: {duration(seconds)} '
        f'<span class="muted">({seconds / 3600:.2f} GPU-hours)</span></h3>'
        '<p class="muted">What each target held its GPU for since midnight UTC, from its strip: '
        "the sum of its card's GPU-seconds.</p>"
        f"{gpu_hours(targets)}</div>"
        f'<div class="card"><h3>Waits for a cold start or wake today: {waits}</h3>'
        f"{waits_histogram(targets)}</div>"
        "</div></section>"
    )


def spend(lines: Mapping[str, Sequence[Sequence[float]]], limit: float, since: float,
          until: float) -> str:  # fmt: skip
    """Each model's cloud spend over the day, cumulative, under the day's budget."""
    height, top, bottom = 104, 4, 100
    peak = max([limit, *(p[1] for line in lines.values() for p in line)], default=0.0) or 1.0

    def y(usd: float) -> float:
        return bottom - (bottom - top) * usd / peak

    out = [
        f'<line class="budget" x1="{LEFT}" y1="{y(limit):.1f}" x2="{WIDTH - LEFT}" '
        f'y2="{y(limit):.1f}" stroke="#d9534f" stroke-dasharray="5 3">'
        f"<title>budget ${limit:,.2f}</title></line>"
    ]
    keys = [f'<li><span style="color:#d9534f">- -</span> budget ${limit:,.2f}</li>']
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
        )
        keys.append(f'<li><span style="color:{c}">―</span> {e(model)} ${last:,.4f}</li>')
    return (
        f'<ul class="legend spend-legend">{"".join(keys)}</ul>'
        f'<svg class="spend-chart" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="cloud spend per model today against the budget">'
        f"{_ticks(since, until, 3 * 3600, height)}{''.join(out)}</svg>"
        f"{tick_labels(since, until, 3 * 3600)}"
    )
