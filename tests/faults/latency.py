"""Normal traffic's latency, measured from the client's side and written to a report; the
fault tests assert on correctness only (a latency is a figure, never a pass/fail)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp


@dataclass
class Sample:
    """One traffic run: each request's latency in seconds and each status seen."""

    label: str
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    @property
    def requests(self) -> int:
        return sum(self.statuses.values()) + len(self.errors)

    def row(self) -> str:
        ms = [1000 * self.quantile(q) for q in (0.5, 0.99, 1.0)]
        return (
            f"| {self.label} | {self.requests} | {self.statuses.get(200, 0)} "
            f"| {ms[0]:.2f} | {ms[1]:.2f} | {ms[2]:.2f} |"
        )


async def traffic(
    url: str,
    label: str,
    *,
    requests: int,
    concurrency: int = 4,
    until: Callable[[], bool] | None = None,
) -> Sample:
    """``requests`` GETs of ``url`` from ``concurrency`` keep-alive clients (or, with ``until``,
    at least that many and on until it holds); each body read whole."""
    sample = Sample(label)
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    sent = 0

    def more() -> bool:
        return sent < requests or (until is not None and not until())

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:

        async def worker() -> None:
            nonlocal sent
            while more():
                sent += 1
                started = time.perf_counter()
                try:
                    async with client.get(url) as resp:
                        await resp.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    sample.errors.append(repr(exc))
                    continue
                sample.latencies.append(time.perf_counter() - started)
                sample.statuses[resp.status] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sample


def write_report(path: Path, title: str, samples: list[Sample], notes: list[str]) -> str:
    """A Markdown table of the samples side by side, written to ``path`` and returned."""
    lines = [
        f"# {title}",
        "",
        "| traffic | requests | 200 | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|",
        *(sample.row() for sample in samples),
        "",
        *(f"- {note}" for note in notes),
    ]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text
