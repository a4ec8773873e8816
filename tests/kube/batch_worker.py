"""A batch training pod for the test kubelet: work in slices on the GPU it was given, a
checkpoint after each (``python -m tests.kube.batch_worker --ledger F --slice 2 --slices 10``).

Each slice is a JSON line in the ledger, useful when it ended in a checkpoint, lost when the pod
was stopped in the middle of it (preempted or evicted: SIGTERM), as a training job with
checkpoints loses the work since its last one::

    {"pod": "trainer-x7k2p", "node": "gpu-box", "gpus": "2", "t0": 1733392000.1,
     "t1": 1733392002.1, "useful": true}

After ``--slices`` slices it exits 0 (the Job's completion); the Job controller makes the next
pod, and a new one for each pod preempted. The pod's name and node come from the Downward API
(``POD_NAME``, ``NODE_NAME``), its GPUs from ``NVIDIA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from types import FrameType


class _Stopped(Exception):
    pass


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped


def record(ledger: str, t0: float, t1: float, useful: bool) -> None:
    line = {
        "pod": os.environ.get("POD_NAME", ""),
        "node": os.environ.get("NODE_NAME", ""),
        "gpus": os.environ.get("NVIDIA_VISIBLE_DEVICES", ""),
        "t0": round(t0, 3),
        "t1": round(t1, 3),
        "useful": useful,
    }
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--slice", type=float, default=2.0, help="seconds between checkpoints")
    ap.add_argument("--slices", type=int, default=10, help="slices before the pod completes")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    t0 = time.time()
    try:
        for _ in range(a.slices):
            time.sleep(max(0.0, t0 + a.slice - time.time()))
            t1 = time.time()
            record(a.ledger, t0, t1, True)
            t0 = t1
    except _Stopped:
        record(a.ledger, t0, time.time(), False)
        return 143
    return 0


if __name__ == "__main__":
    sys.exit(main())
