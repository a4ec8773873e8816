"""What a replay comes to, per configuration: GPU-hours held (busy / idle / starting / draining /
parked), cold starts and wakes met and their waits, parks and the GPU pools' displacements, the
cloud, and a total cost at ``economics:``'s prices; side by side as a table, and as CSV."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from router.simulate.run import HELD_PHASES, Outcome, Result


@dataclass(frozen=True, slots=True)
class Summary:
    config: str
    requests: int
    gpu_hours_held: float
    gpu_hours_busy: float
    gpu_hours_idle: float
    gpu_hours_starting: float
    gpu_hours_draining: float
    gpu_hours_parked: float
    cold_starts: int
    cold_requests: int
    """Requests that met a cold start."""
    wait_p50: float
    wait_p95: float
    wait_max: float
    parks: int
    wakes: int
    wake_requests: int
    """Requests that met a wake from parked."""
    wake_p50: float
    wake_p95: float
    wake_max: float
    displaced: int
    """Targets parked or stopped to make room in a GPU pool."""
    pool_waits: int
    cloud_requests: int
    cloud_usd: float
    rejected: int
    failed: int
    gpu_usd: float
    wait_usd: float
    total_usd: float
    idle_after: str
    """The ``idle_after`` in force at the end, per target (learned ones marked)."""
    park_after: str
    """The ``park_after`` in force at the end, per target that parks."""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(result: Result) -> Summary:
    economics = result.config.economics
    hours = {phase: 0.0 for phase in HELD_PHASES}
    busy = idle = 0.0
    cold_starts = parks = wakes = displaced = pool_waits = 0
    shown, parking = [], []
    for name, record in result.targets.items():
        for phase in HELD_PHASES:
            hours[phase] += record.seconds_in.get(phase, 0.0) / 3600
        busy += record.busy / 3600
        idle += record.idle / 3600
        cold_starts += record.cold_starts
        parks, wakes = parks + record.parks, wakes + record.wakes
        displaced, pool_waits = displaced + record.displaced, pool_waits + record.pool_waits
        scaling = result.config.targets[name].scaling
        learning = " learned" if record.learned else " auto, not yet learned"
        shown.append(f"{name}={_span(record.idle_after)}{learning if scaling.idle_auto else ''}")
        if record.park_after > 0 or scaling.park_auto:
            mark = learning if scaling.park_auto else ""
            parking.append(f"{name}={_span(record.park_after)}{mark}")
    held = sum(hours.values())
    waits = [o.waited for o in result.outcomes if o.met != "wake" and o.cold and _local(o)]
    woken = [o.waited for o in result.outcomes if o.met == "wake" and _local(o)]
    wait_all = sum(o.waited for o in result.outcomes if o.cold)
    cloud = [o for o in result.outcomes if o.placement == "cloud"]
    cloud_usd = sum(o.cloud_usd for o in cloud)
    gpu_usd = (held - hours["parked"]) * economics.gpu_hour_usd
    gpu_usd += hours["parked"] * economics.parked_hour_usd
    wait_usd = wait_all * economics.cold_wait_usd_per_second
    return Summary(
        config=result.label,
        requests=len(result.outcomes),
        gpu_hours_held=held,
        gpu_hours_busy=busy,
        gpu_hours_idle=idle,
        gpu_hours_starting=hours["starting"],
        gpu_hours_draining=hours["draining"],
        gpu_hours_parked=hours["parked"],
        cold_starts=cold_starts,
        cold_requests=sum(1 for o in result.outcomes if o.cold and o.met != "wake"),
        wait_p50=percentile(waits, 50),
        wait_p95=percentile(waits, 95),
        wait_max=max(waits, default=0.0),
        parks=parks,
        wakes=wakes,
        wake_requests=sum(1 for o in result.outcomes if o.met == "wake"),
        wake_p50=percentile(woken, 50),
        wake_p95=percentile(woken, 95),
        wake_max=max(woken, default=0.0),
        displaced=displaced,
        pool_waits=pool_waits,
        cloud_requests=len(cloud),
        cloud_usd=cloud_usd,
        rejected=sum(1 for o in result.outcomes if o.placement == "rejected"),
        failed=sum(1 for o in result.outcomes if o.placement == "failed"),
        gpu_usd=gpu_usd,
        wait_usd=wait_usd,
        total_usd=gpu_usd + wait_usd + cloud_usd,
        idle_after=" ".join(shown),
        park_after=" ".join(parking) or "-",
    )


def _local(outcome: Outcome) -> bool:
    return outcome.placement == "local"


def _span(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60:
        return f"{seconds / 60:.3g}m"
    return f"{seconds:.3g}s"


ROWS = (
    ("GPU-hours held", lambda s: f"{s.gpu_hours_held:.2f}"),
    ("  busy", lambda s: f"{s.gpu_hours_busy:.2f}"),
    ("  idle", lambda s: f"{s.gpu_hours_idle:.2f}"),
    ("  starting", lambda s: f"{s.gpu_hours_starting:.2f}"),
    ("  draining", lambda s: f"{s.gpu_hours_draining:.2f}"),
    ("  parked", lambda s: f"{s.gpu_hours_parked:.2f}"),
    ("cold starts", lambda s: str(s.cold_starts)),
    ("requests that met one", lambda s: f"{s.cold_requests} of {s.requests}"),
    (
        "  wait p50 / p95 / max",
        lambda s: f"{s.wait_p50:.0f}s / {s.wait_p95:.0f}s / {s.wait_max:.0f}s",
    ),
    ("parks / wakes", lambda s: f"{s.parks} / {s.wakes}"),
    ("requests that met a wake", lambda s: f"{s.wake_requests} of {s.requests}"),
    (
        "  wait p50 / p95 / max",
        lambda s: f"{s.wake_p50:.1f}s / {s.wake_p95:.1f}s / {s.wake_max:.1f}s",
    ),
    ("pool: displaced / waits", lambda s: f"{s.displaced} / {s.pool_waits}"),
    ("to the cloud", lambda s: f"{s.cloud_requests} (${s.cloud_usd:.2f})"),
    ("rejected / failed", lambda s: f"{s.rejected} / {s.failed}"),
    ("GPU cost", lambda s: f"${s.gpu_usd:.2f}"),
    ("waiting cost", lambda s: f"${s.wait_usd:.2f}"),
    ("total cost", lambda s: f"${s.total_usd:.2f}"),
    ("idle_after at the end", lambda s: s.idle_after),
    ("park_after at the end", lambda s: s.park_after),
)


def table(summaries: Sequence[Summary], markdown: bool = False) -> str:
    """One column per configuration, one row per figure."""
    header = ["", *(s.config for s in summaries)]
    rows = [header] + [[name, *(cell(s) for s in summaries)] for name, cell in ROWS]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def write_csv(summaries: Sequence[Summary], path: Path) -> None:
    """One line per configuration, a column per figure."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        fields = list(asdict(summaries[0])) if summaries else []
        out = csv.DictWriter(handle, fields, lineterminator="\n")
        out.writeheader()
        for summary in summaries:
            out.writerow(
                {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(summary).items()}
            )
