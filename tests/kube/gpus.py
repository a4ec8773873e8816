"""Which of a Node's GPUs each pod holds, as a device plugin would hand them out: the test
kubelet takes a pod's ``nvidia.com/gpu`` limit of devices while its process runs and gives them
back when it ends, so a day on the cluster can be drawn one row per GPU (cluster_day's picture).

Each hand-out and return is a JSON line in an optional ledger (several kubelets may share one:
each line is one ``write`` of an ``O_APPEND`` file)::

    {"t": 1733392000.12, "node": "gpu-box", "gpu": 2, "pod": "ns/trainer-x7k2p",
     "app": "trainer", "event": "on"}
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GPU = "nvidia.com/gpu"


def wanted(pod: dict[str, Any]) -> int:
    """The GPUs the pod's first container asks for (its limit; requests equal it for an
    extended resource)."""
    c = pod["spec"]["containers"][0]
    resources = c.get("resources") or {}
    said = (resources.get("limits") or {}).get(GPU) or (resources.get("requests") or {}).get(GPU)
    try:
        return max(0, int(str(said or 0)))
    except ValueError:
        return 0


class GpuSlots:
    """The node's ``count`` GPUs, numbered 0..count-1."""

    def __init__(self, node: str, count: int, ledger: Path | None = None) -> None:
        self.node = node
        self.free = list(range(count))
        self.ledger = ledger

    @contextlib.contextmanager
    def held(self, pod: dict[str, Any]) -> Iterator[list[int]]:
        """The devices the pod holds while the block runs (fewer when the scheduler let it
        overcommit, which it does not: then it is told by the ledger)."""
        n = wanted(pod)
        taken, self.free = self.free[:n], self.free[n:]
        self._log(pod, taken, "on")
        try:
            yield taken
        finally:
            self.free = sorted(self.free + taken)
            self._log(pod, taken, "off")

    def _log(self, pod: dict[str, Any], gpus: list[int], event: str) -> None:
        if self.ledger is None or not gpus:
            return
        meta = pod["metadata"]
        app = (meta.get("labels") or {}).get("app") or meta.get("generateName") or meta["name"]
        lines = "".join(
            json.dumps(
                {
                    "t": round(time.time(), 3),
                    "node": self.node,
                    "gpu": g,
                    "pod": f"{meta['namespace']}/{meta['name']}",
                    "app": app,
                    "event": event,
                }
            )
            + "\n"
            for g in gpus
        )
        fd = os.open(self.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
