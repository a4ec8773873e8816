"""Two pictures of a simulation (``--out DIR``), with matplotlib (imported only here, only then):
each target's phase over time under its requests, per configuration; and each configuration's
cost as it accumulates."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from router.simulate.run import HELD_PHASES, Result

COLORS = {
    "cold": "#dddddd",
    "starting": "#f0a030",
    "ready": "#3a9a4a",
    "draining": "#8a6ad0",
    "failed": "#d04040",
    "parked": "#4a90d0",
}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError(
            "the pictures need matplotlib: pip install 'warmgate[simulate]'"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def cumulative_cost(result: Result) -> tuple[list[float], list[float]]:
    """(hours, USD so far): the GPU while held (at the parked price while parked), each cold
    wait as it ends, each cloud call."""
    economics = result.config.economics
    events: list[tuple[float, float, float]] = []  # (at, rate change USD/s, lump USD)
    for record in result.targets.values():
        rate = 0.0
        for at, phase in record.phases:
            now = 0.0
            if phase == "parked":
                now = economics.parked_second_usd
            elif phase in HELD_PHASES:
                now = economics.gpu_second_usd
            if now != rate:
                events.append((at, now - rate, 0.0))
                rate = now
    for o in result.outcomes:
        lump = o.waited * economics.cold_wait_usd_per_second if o.cold else 0.0
        if lump or o.cloud_usd:
            events.append((o.request.at + o.waited, 0.0, lump + o.cloud_usd))
    events.sort(key=lambda e: e[0])
    xs, ys = [0.0], [0.0]
    rate = total = last = 0.0
    for at, change, lump in [*events, (result.horizon, 0.0, 0.0)]:
        total += rate * (at - last)
        xs.append(at / 3600)
        ys.append(total)
        total += lump
        rate += change
        last = at
        if lump:
            xs.append(at / 3600)
            ys.append(total)
    return xs, ys


def draw(results: Sequence[Result], out: Path) -> list[Path]:
    """``timeline.png`` and ``cost.png`` in ``out``; their paths."""
    plt = _pyplot()
    paths = [out / "timeline.png", out / "cost.png"]
    names = sorted({name for r in results for name in r.targets})
    rows = [(r, name) for r in results for name in names if name in r.targets]
    fig, axes = plt.subplots(len(rows), 1, figsize=(12, 1.1 * len(rows) + 1.2), sharex=True)
    axes = [axes] if len(rows) == 1 else list(axes)
    for ax, (result, name) in zip(axes, rows, strict=True):
        record = result.targets[name]
        spans = [*record.phases, (result.horizon, "end")]
        for (at, phase), (end, _) in itertools.pairwise(spans):
            ax.axvspan(at / 3600, end / 3600, ymin=0.0, ymax=0.6, color=COLORS.get(phase, "#999"))
        times = [o.request.at / 3600 for o in result.outcomes if _target(o) == name]
        cold = [o.request.at / 3600 for o in result.outcomes if _target(o) == name and o.cold]
        ax.plot(times, [0.8] * len(times), "|", color="#333333", markersize=6)
        ax.plot(cold, [0.92] * len(cold), "v", color="#d04040", markersize=4)
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_ylabel(f"{result.label}\n{name}", rotation=0, ha="right", va="center", fontsize=7)
    axes[-1].set_xlabel("hours from the start of the trace")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    fig.legend(handles, list(COLORS), loc="upper center", ncol=len(COLORS), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for result in results:
        xs, ys = cumulative_cost(result)
        ax.plot(xs, ys, label=result.label)
    ax.set_xlabel("hours from the start of the trace")
    ax.set_ylabel("cost so far (USD)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def _target(outcome: Any) -> str:
    request = outcome.request
    return str(request.target or request.model or "")
