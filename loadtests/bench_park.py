"""Section "park": a wake from parked against a cold start, on the demo engine, side by side.

One ``engine: comfyui`` target runs the demo engine (a 256 MiB checkpoint, renders of 0 s) with a
warm-up workflow, so that ready means the checkpoint is resident and has rendered once, after a
cold start and after a wake alike. ``park_after: 1s``, ``idle_after: 4s``: each round a request
meets the target parked (the engine dropped its checkpoint, its process stays: the wake copies
it back from host memory and runs the warm-up), then, once it was stopped, cold (a new process,
its imports, the load from the page cache and the warm-up). The figure is the client's: request
sent -> answered, warmgate's hold included. Goal: the median wake at most 0.2x the median cold
start.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from loadtests.bench_coldstart import phase, wait_phase
from loadtests.contenders import start_warmgate_config
from loadtests.harness import (
    PYTHON,
    ROOT,
    Ctx,
    Goal,
    Procs,
    SectionResult,
    StartError,
    http_get,
    section,
)

ROUNDS = 10
GOAL_RATIO = 0.2
CHECKPOINT = "256MiB"

WARMUP = {
    "3": {"class_type": "KSampler", "inputs": {"seed": 1, "steps": 1, "model": ["4", 0],
          "positive": ["6", 0], "negative": ["6", 0], "latent_image": ["5", 0]}},
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "demo"}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64,
          "batch_size": 1}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "warm-up", "clip": ["4", 1]}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
    "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "w", "images": ["8", 0]}},
}  # fmt: skip
"""A 64x64, one-step render: the demo engine loads its checkpoint for it (a reload, after a
park), and renders in no time (``--render-seconds 0``)."""


def _target(ctx: Ctx) -> str:
    workflow = ctx.workdir / "park-warmup.json"
    workflow.write_text(json.dumps(WARMUP))
    command = json.dumps(
        [PYTHON, "-m", "backends.demo_engine", "--port", "{port}", "--checkpoint-size",
         CHECKPOINT, "--checkpoint", str(ctx.workdir / "park-checkpoint.bin"),
         "--render-seconds", "0"]
    )  # fmt: skip
    return f"""\
  demo:
    engine: comfyui
    warmup_workflow: {workflow}
    routes: [{{path_prefix: /}}]
    backend: {{kind: process, command: {command}, cwd: "{ROOT}", stop_grace: 5s,
              env: {{EAGER_LOAD_MODEL: "1"}}}}
    readiness: {{path: /readyz, interval: 20ms, timeout: 2s}}
    scaling: {{park_after: 1s, idle_after: 4s, cold_start_timeout: 120s, busy_poll: 200ms}}
"""


def _timed(port: int, what: str, procs: Procs) -> float:
    t0 = time.monotonic()
    status, _ = http_get(port, "/", timeout=120)
    took = time.monotonic() - t0
    if status != 200:
        raise RuntimeError(f"{what}: HTTP {status}\n{procs.log_tail('wg-park')}")
    return took


def _parked(admin: int) -> bool:
    state: dict[str, Any] = phase(admin, "demo")
    return state["phase"] == "parked" and not state.get("parking") and not state.get("waking")


@section("park")
def run_park(ctx: Ctx) -> SectionResult:
    wakes: list[float] = []
    colds: list[float] = []
    with Procs(ctx.workdir) as procs:
        try:
            port, admin = start_warmgate_config(ctx, procs, "wg-park", _target(ctx))
            procs.wait_http("wg-park", admin, "/healthz")
        except StartError as e:
            return SectionResult(f"skipped: {e}", {"skipped": str(e)}, [])
        _timed(port, "first start (creates the checkpoint file)", procs)
        for _ in range(ROUNDS):
            wait_phase(admin, "demo", "parked", 60)
            deadline = time.monotonic() + 10
            while not _parked(admin) and time.monotonic() < deadline:
                time.sleep(0.02)
            wakes.append(_timed(port, "wake", procs))
            wait_phase(admin, "demo", "cold", 60)
            colds.append(_timed(port, "cold start", procs))
        wait_phase(admin, "demo", "cold", 60)
    wake, cold = statistics.median(wakes), statistics.median(colds)
    ratio = wake / cold if cold > 0 else None
    ctx.log(f"  park: wake {wake * 1e3:.0f} ms, cold start {cold * 1e3:.0f} ms (median of "
            f"{ROUNDS}), ratio {ratio:.2f}")  # fmt: skip
    md = [
        f"The demo engine (`engine: comfyui`, a {CHECKPOINT} checkpoint, a one-step warm-up "
        "workflow, renders of 0 s) behind warmgate, "
        f"{ROUNDS} rounds: a request to the parked target (a wake: the checkpoint copied back "
        "from host memory, the warm-up run), then one to the same target stopped (a cold start: "
        "process, imports, load from the page cache, warm-up). Client's time, request sent -> "
        "answered. On the CPU both reload the same bytes; on a GPU a cold start adds the CUDA "
        "context and the wake is one pinned host-to-device copy (loadtests/gpu_check.sh).",
        "",
        "| | median | min | max |",
        "|---|---|---|---|",
        f"| wake from parked | {wake * 1e3:.0f} ms | {min(wakes) * 1e3:.0f} ms | "
        f"{max(wakes) * 1e3:.0f} ms |",
        f"| cold start | {cold * 1e3:.0f} ms | {min(colds) * 1e3:.0f} ms | "
        f"{max(colds) * 1e3:.0f} ms |",
        f"| wake / cold start | {ratio:.2f}x | | |",
    ]
    goal = Goal(
        f"wake from parked / cold start, medians of {ROUNDS} (x)",
        ratio,
        f"<= {GOAL_RATIO:g}",
        None if ratio is None else ratio <= GOAL_RATIO,
    )
    data = {"wake_s": wakes, "cold_s": colds, "ratio": ratio}
    return SectionResult("\n".join(md), data, [goal])
