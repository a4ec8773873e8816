"""A short day of contention on the real scheduler (the long one: ``make cluster-day``): warmgate's
own policy (``idle_after: auto``, render pods at ``warmgate-interactive``) in front of an image UI
and a video UI on a 4-GPU box and a 1-GPU workstation, a batch Job taking every GPU they leave.

Invariants, not timings: nothing is lost; each UI's GPU goes back to the scheduler within its
``idle_after`` and a bounded grace after its last use; batch runs on every GPU no UI holds
(within a bound); a cold start that needs a GPU taken from batch preempts instead of waiting for
a batch pod to end."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from router.simulate.trace import Request

from .cluster import KubeCluster
from .day import UIS, day_lab
from .dayrun import Day, run_day

COMPRESSION = 600.0
"""A day's 10 minutes in a second: idle_after auto's bounds are 0.2 s to 6 s."""
GRACE = 10.0
"""Seconds past ``idle_after`` for a GPU to be back: the engine's queue going quiet (busy
poll), the scale-down, the pod's termination."""
BATCH_GAP = 15.0
"""Seconds a GPU may be free while the batch queue waits: the Job controller's new pod, the
scheduler's retry, the process start."""


def _trace() -> list[Request]:
    """Day seconds: the image UI opened and used, the video UI opened beside it, a long absence
    (both released, batch takes the GPUs), then the image UI again."""
    rows = [(0, "comfyui", "page"), (60, "comfyui", "render"), (180, "comfyui", "render"),
            (600, "wan2gp", "page"), (700, "wan2gp", "render"), (900, "comfyui", "render"),
            (9000, "comfyui", "page"), (9100, "comfyui", "render")]  # fmt: skip
    return [
        Request(float(at), target, None, kind, UIS[target], None, False, i + 2)
        for i, (at, target, kind) in enumerate(rows)
    ]


def _released_in_time(day: Day) -> list[str]:
    """UI GPUs held longer than idle_after + GRACE past the last use before they went back."""
    late = []
    for h in day.held():
        if h.app not in UIS:
            continue
        if h.off is None:
            late.append(f"{h.pod} still holds {h.node}/gpu{h.gpu} at the end")
            continue
        used = [m.at + m.wait for m in day.met if m.target == h.app and m.at < h.off]
        windows = [s.idle_after for s in day.samples if s.target == h.app and s.idle_after]
        if not used or not windows:
            continue
        bound = max(used) + max(windows) + UIS[h.app] / COMPRESSION + GRACE
        if h.off > bound:
            late.append(f"{h.pod} let {h.node}/gpu{h.gpu} go {h.off - bound:.1f}s late")
    return late


async def test_a_short_day_keeps_the_invariants(
    kube_cluster: KubeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not kube_cluster.has_scheduler:
        message = "kube-scheduler not built (tools/kube/build.sh builds it)"
        if os.environ.get("WARMGATE_KUBE_REQUIRED"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    monkeypatch.setenv("KUBECONFIG", "")  # run_day sets it: restored afterwards
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    namespace = f"day-{uuid.uuid4().hex[:8]}"
    # Batch pods of 60 s (300 slices of 0.2 s): longer than any cold start, so a start that
    # waited for one to end instead of preempting it would show.
    async with day_lab(
        kube_cluster, tmp_path, "warmgate", COMPRESSION, namespace, slices_per_pod=300
    ) as lab:
        day = await run_day(lab, _trace(), tail=3660 / COMPRESSION + 2 * GRACE)

    assert not [m for m in day.met if m.lost], "nothing lost"
    assert not (late := _released_in_time(day)), late
    assert day.pending, "the batch queue was sampled"
    waited = [(g, day.waited(g[2], g[3])) for g in day.free_gaps()]
    gaps = [(g, round(w, 1)) for g, w in waited if w > BATCH_GAP]
    assert not gaps, f"GPUs left free while batch waited (gap, seconds a pod waited): {gaps}"
    _, lost = day.batch_seconds()
    assert lost > 0, "a batch pod was preempted for a cold start"
    assert day.metric("warmgate_cold_start_stage_seconds_count.preempting") >= 1
    pages = [m for m in day.met if m.kind == "page" and m.cold]
    assert pages, "the UIs started cold"
    slowest = max(m.wait for m in pages)
    assert slowest < 300 * 0.2 / 2, f"a cold start waited {slowest:.1f}s: for a batch pod's end?"
