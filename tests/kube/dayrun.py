"""Run a day on a DayLab (day.py) through warmgate and read what it did: the people's outcomes,
warmgate's view of its targets every moment, its metrics, and the ledgers of who held each GPU
(gpus.py) and of the batch work done and lost (batch_worker.py).

The readings are pure functions of those records, shared by loadtests/cluster_day.py (the
tables) and test_cluster_day.py (the invariants)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from router.scale.state import Phase
from router.simulate.trace import Request
from tests.helpers import warmgate

from .day import NODES, UIS, DayLab
from .people import Met, People


@dataclass(frozen=True)
class Sample:
    t: float
    target: str
    phase: str
    busy: bool
    idle_after: float | None


@dataclass(frozen=True)
class Held:
    """A GPU held by a pod from ``on`` to ``off`` (wall clock; ``off`` None: still held)."""

    node: str
    gpu: int
    app: str
    pod: str
    on: float
    off: float | None


@dataclass
class Day:
    lab: DayLab
    began: float = 0.0
    ended: float = 0.0
    met: list[Met] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    pending: list[tuple[float, int]] = field(default_factory=list)
    """(time, batch pods pending): the queue waiting for a GPU, sampled. A Job holds back its
    replacement of a failed pod (a preempted one exits 143) for its own backoff: no pod waits
    then, and a GPU left free meanwhile is the Job's choice, not warmgate's."""
    ledgers: dict[Path, list[dict[str, Any]]] = field(default_factory=dict)
    """The ledgers as read when the day ended (their files go with the lab's folder)."""

    # -- the ledgers -----------------------------------------------------------------------

    def keep_ledgers(self) -> None:
        """Read the ledgers now: the report and the picture are made after the lab is gone."""
        for path in (self.lab.gpu_ledger, self.lab.batch_ledger):
            self.ledgers[path] = _lines(path)

    def _ledger(self, path: Path) -> list[dict[str, Any]]:
        return self.ledgers[path]

    def held(self) -> list[Held]:
        opened: dict[tuple[str, int, str], dict[str, Any]] = {}
        out = []
        for e in self._ledger(self.lab.gpu_ledger):
            key = (e["node"], e["gpu"], e["pod"])
            if e["event"] == "on":
                opened[key] = e
            elif key in opened:
                o = opened.pop(key)
                out.append(Held(o["node"], o["gpu"], o["app"], o["pod"], o["t"], e["t"]))
        out += [
            Held(o["node"], o["gpu"], o["app"], o["pod"], o["t"], None) for o in opened.values()
        ]
        return sorted(out, key=lambda h: h.on)

    def batch_seconds(self) -> tuple[float, float]:
        """(useful, lost) batch GPU-seconds within the day (compressed)."""
        useful = lost = 0.0
        for s in self._ledger(self.lab.batch_ledger):
            span = max(0.0, min(s["t1"], self.ended) - max(s["t0"], self.began))
            if s["useful"]:
                useful += span
            else:
                lost += span
        return useful, lost

    def free_gaps(self) -> list[tuple[str, int, float, float]]:
        """Stretches of the day when a GPU was held by nobody: (node, gpu, from, to)."""
        gaps = []
        for node, count in NODES:
            for gpu in range(count):
                spans = sorted(
                    (h.on, h.off or self.ended)
                    for h in self.held()
                    if h.node == node and h.gpu == gpu
                )
                t = self.began
                for on, off in spans:
                    if on > t:
                        gaps.append((node, gpu, t, min(on, self.ended)))
                    t = max(t, off)
                if t < self.ended:
                    gaps.append((node, gpu, t, self.ended))
        return [g for g in gaps if g[3] > g[2]]

    def waited(self, start: float, end: float) -> float:
        """Seconds between ``start`` and ``end`` during which a batch pod was pending."""
        total = 0.0
        for (t, pending), (t_next, _) in zip(
            self.pending, [*self.pending[1:], (self.ended, 0)], strict=True
        ):
            if pending:
                total += max(0.0, min(t_next, end) - max(t, start))
        return total

    def ui_seconds(self) -> float:
        """GPU-seconds held by render pods within the day."""
        return sum(
            max(0.0, min(h.off or self.ended, self.ended) - max(h.on, self.began))
            for h in self.held()
            if h.app in UIS
        )

    def metric(self, name: str) -> float:
        return self.metrics.get(name, 0.0)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def read_metrics(text: str) -> dict[str, float]:
    """Sums over the targets of the figures the day reads (``name{state=..}`` kept apart)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        base = name.split("{", 1)[0]
        labels = name[len(base) :]
        key = base
        for wanted in ('state="', 'stage="', 'outcome="'):
            if wanted in labels:
                key += "." + labels.split(wanted, 1)[1].split('"', 1)[0]
        with contextlib.suppress(ValueError):
            out[key] = out.get(key, 0.0) + float(value)
    return out


async def _settled(lab: DayLab, expected: int) -> None:
    """Until ``expected`` batch pods run (the queue has taken every GPU the UIs leave)."""
    core = client.CoreV1Api(lab.admin)
    async with asyncio.timeout(120):
        while True:
            pods = await core.list_namespaced_pod(lab.namespace, label_selector="app=trainer")
            running = [p for p in pods.items if p.status.phase == "Running"]
            if len(running) >= expected:
                return
            await asyncio.sleep(0.2)


async def _sample_queue(lab: DayLab, day: Day, period: float = 0.5) -> None:
    core = client.CoreV1Api(lab.admin)
    while True:
        with contextlib.suppress(client.ApiException, aiohttp.ClientError, TimeoutError):
            pods = await core.list_namespaced_pod(lab.namespace, label_selector="app=trainer")
            pending = sum(1 for p in pods.items if p.status.phase == "Pending")
            day.pending.append((time.time(), pending))
        await asyncio.sleep(period)


async def _sample(admin: str, day: Day, period: float = 0.2) -> None:
    async with aiohttp.ClientSession() as http:
        while True:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with http.get(admin + "/targets") as resp:
                    targets = await resp.json()
                t = time.time()
                for name, s in targets.items():
                    busy = bool(s["in_flight"] or s["held"] or s["streams"] or s["queue_depth"])
                    idle_after = s.get("idle_after")
                    day.samples.append(
                        Sample(
                            t,
                            name,
                            s["phase"],
                            busy,
                            None if idle_after is None else float(idle_after),
                        )
                    )
            await asyncio.sleep(period)


async def run_day(lab: DayLab, trace: Sequence[Request], tail: float) -> Day:
    """warmgate (as deploy/'s ServiceAccount) in front of the lab, the trace replayed, then
    ``tail`` seconds more (compressed) for the last idle windows to end."""
    kubeconfig = await asyncio.to_thread(
        lab.cluster.service_account_kubeconfig, lab.namespace, "warmgate", False
    )
    os.environ["KUBECONFIG"] = str(kubeconfig)  # as as_warmgate sets it, for this process
    os.environ.pop("KUBERNETES_SERVICE_HOST", None)
    gpus = sum(g for _, g in NODES)
    await _settled(lab, gpus - (len(UIS) if lab.policy == "always" else 0))
    day = Day(lab)
    async with warmgate(lab.config(kubeconfig)) as wg:
        if lab.policy == "always":
            async with asyncio.timeout(120):
                for name in UIS:
                    await wg.runtime(name).cell.wait_for(lambda s: s.phase is Phase.READY)
        sampler = asyncio.create_task(_sample(wg.admin, day))
        queue = asyncio.create_task(_sample_queue(lab, day))
        try:
            people = People(wg.url, lab.compression)
            day.began = time.time()
            await people.replay(trace, day.began)
            last = max((r.at for r in trace), default=0.0) / lab.compression
            await asyncio.sleep(max(0.0, day.began + last + tail - time.time()))
            day.ended = time.time()
            day.met = people.met
        finally:
            for task in (sampler, queue):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        async with aiohttp.ClientSession() as http, http.get(wg.admin + "/metrics") as resp:
            day.metrics = read_metrics(await resp.text())
    day.keep_ledgers()
    return day
