"""Section "policy": the placement decision's cost, and the time to first token of a streamed
chat completion through warmgate's OpenAI API vs direct to the same server.

    python -m loadtests.bench --section policy [--quick]

Decision: 50 models x 4 placements (2 local targets in mixed phases, 2 cloud models), timed
per call; once ``decide`` alone (the pure function), once as a request pays for it (the
snapshot of the model's placements from the live runtimes, cost estimate included, + decide).
TTFT: a fake OpenAI-compatible server (tests.fake_openai) as the local target, requests
interleaved direct / through warmgate on keep-alive connections, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any, cast

from loadtests.harness import (
    PYTHON,
    Ctx,
    Goal,
    Procs,
    SectionResult,
    StartError,
    free_port,
    section,
)

MODELS, LOCALS, CLOUDS = 50, 2, 2
DECIDE_GOAL_US = 50.0
TTFT_GOAL_MS = 1.0
HELLO = [{"role": "user", "content": "Write one short sentence about warm gates."}]


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.50), "p99": at(0.99), "p999": at(0.999), "mean": statistics.fmean(ordered)}


def _config(up_url: str) -> dict[str, Any]:
    targets = {
        f"t{i}": {
            "routes": [{"path_prefix": f"/t{i}"}],
            "backend": {"kind": "static", "url": up_url},
        }
        for i in range(MODELS * LOCALS)
    }
    prices = {"input_per_mtok": 3.0, "output_per_mtok": 15.0}
    models = {
        f"m{m}": {
            "placements": [{"target": f"t{m * LOCALS + j}"} for j in range(LOCALS)]
            + [{"cloud": f"c{j}", "model": f"big{j}", "cost": prices} for j in range(CLOUDS)]
        }
        for m in range(MODELS)
    }
    clouds = {
        f"c{j}": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "WARMGATE_BENCH_KEY"}
        for j in range(CLOUDS)
    }
    return {
        "listen": "127.0.0.1:0",
        "admin_listen": "127.0.0.1:0",
        "server": {"access_log": False},
        "targets": targets,
        "models": models,
        "clouds": clouds,
        "policy": {"daily_cloud_budget_usd": 25},
        "api": {"allow_anonymous": True},
    }


async def _decision_times(n: int) -> dict[str, dict[str, float]]:
    from router.app import build_apps
    from router.config import parse_config
    from router.openai.api import OPENAI_API
    from router.openai.call import Call
    from router.openai.costs import bound
    from router.openai.facts import Ask
    from router.openai.policy import decide
    from router.scale.state import Phase, TargetState

    os.environ.setdefault("WARMGATE_BENCH_KEY", "bench")
    config = parse_config(_config("http://127.0.0.1:9"))
    apps = build_apps(config)  # nothing is started: runtimes, policy and budget only
    api = apps.public[OPENAI_API]
    loop = asyncio.get_running_loop()
    rng = random.Random(7)
    phases = (Phase.READY, Phase.COLD, Phase.STARTING, Phase.FAILED)
    for runtime in api.runtimes.values():
        phase = rng.choice(phases)
        endpoints = ("http://127.0.0.1:9",) if phase is Phase.READY else ()
        runtime.cell.replace(TargetState(phase, loop.time() - rng.random() * 20, endpoints))
        runtime.activity.in_flight = rng.randrange(8)
        runtime.learned.cold_starts.history.extend(
            rng.uniform(5, 60) for _ in range(rng.randrange(21))
        )
    calls = []
    for m in range(MODELS):
        model = f"m{m}"
        body = {"model": model, "messages": HELLO, "max_tokens": rng.choice([None, 256])}
        ask = Ask(private=rng.random() < 0.2, max_wait=rng.choice([0.0, 10.0, 60.0]))
        fake = Call(
            request=cast(Any, None),
            request_id="bench",
            client=cast(Any, None),
            model=model,
            spec=config.models[model],
            body=body,
            raw=json.dumps(body).encode(),
            ask=ask,
            started=0.0,
            bound=bound("chat", body, 1024),
        )
        calls.append(fake)
    snaps = [api.snapshot(c) for c in calls]
    rules, clock = api.rules, time.perf_counter_ns
    order = [rng.randrange(MODELS) for _ in range(n)]
    for i in order[: n // 10]:  # warm-up
        decide(calls[i].ask, api.snapshot(calls[i]), rules)
    pure: list[float] = []
    for i in order:
        ask, snap = calls[i].ask, snaps[i]
        t0 = clock()
        decide(ask, snap, rules)
        pure.append((clock() - t0) / 1000)
    full: list[float] = []
    for i in order:
        call = calls[i]
        t0 = clock()
        decide(call.ask, api.snapshot(call), rules)
        full.append((clock() - t0) / 1000)
    await api.close()
    return {"decide": _percentiles(pure), "snapshot+decide": _percentiles(full)}


async def _ttft_one(session: Any, url: str, body: bytes) -> float:
    """Milliseconds from sending the request to the first content token (then drained)."""
    t0 = time.perf_counter()
    first = None
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.read())[:200]!r}")
        async for line in r.content:
            if first is None and b'"content": "' in line and b'"content": ""' not in line:
                first = time.perf_counter()
    if first is None:
        raise RuntimeError(f"{url}: no content token in the stream")
    return (first - t0) * 1000


async def _ttft(urls: dict[str, str], n: int) -> dict[str, dict[str, float]]:
    import aiohttp

    body = json.dumps({"model": "bench", "messages": HELLO, "stream": True}).encode()
    times: dict[str, list[float]] = {name: [] for name in urls}
    connector = aiohttp.TCPConnector(limit=4)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(max(20, n // 10)):  # warm-up: connections, imports, first pools
            for url in urls.values():
                await _ttft_one(session, url, body)
        for _ in range(n):  # interleaved, so drifting background load hits all alike
            for name, url in urls.items():
                times[name].append(await _ttft_one(session, url, body))
    return {name: _percentiles(samples) for name, samples in times.items()}


def _start(ctx: Ctx, procs: Procs) -> dict[str, str]:
    up_port, port, admin = free_port(), free_port(), free_port()
    procs.start(
        "openai-upstream",
        [PYTHON, "-m", "tests.fake_openai", "--port", str(up_port)],
        cpus=ctx.load_cpus,
    )
    procs.wait_http("openai-upstream", up_port, "/v1/models")
    binary = Path(os.environ.get("WARMGATE_BIN") or Path(PYTHON).parent / "warmgate")
    if not binary.exists():
        raise StartError(f"{binary} not found (pip install -e . in the venv)")
    cfg = ctx.workdir / "warmgate-policy.yaml"
    cfg.write_text(
        json.dumps(
            {
                "listen": f"127.0.0.1:{port}",
                "admin_listen": f"127.0.0.1:{admin}",
                "targets": {
                    "llm": {
                        "routes": [{"path_prefix": "/llm", "strip_prefix": True}],
                        "backend": {"kind": "static", "url": f"http://127.0.0.1:{up_port}"},
                    }
                },
                "models": {"bench": {"placements": [{"target": "llm"}]}},
            }
        )
    )
    procs.start(
        "warmgate-policy", [str(binary), "serve", "--config", str(cfg)], cpus=ctx.proxy_cpus
    )
    procs.wait_http("warmgate-policy", port, "/v1/models")
    path = "/v1/chat/completions"
    return {
        "direct": f"http://127.0.0.1:{up_port}{path}",
        "warmgate": f"http://127.0.0.1:{port}{path}",
        "warmgate, proxy route": f"http://127.0.0.1:{port}/llm{path}",
    }


@contextlib.contextmanager
def _pinned(cpus: set[int] | None) -> Any:
    before = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def render(
    decisions: dict[str, dict[str, float]],
    ttft: dict[str, dict[str, float]] | None,
    skipped: str | None,
) -> str:
    out = [
        f"### decision time, {MODELS} models x {LOCALS + CLOUDS} placements (µs)",
        "",
        "| measured | p50 | p99 | p99.9 | mean |",
        "|---|---|---|---|---|",
    ]
    for name, p in decisions.items():
        out.append(
            f"| {name} | {p['p50']:.1f} | {p['p99']:.1f} | {p['p999']:.1f} | {p['mean']:.1f} |"
        )
    out += ["", "### time to first token, streamed chat completion (ms)", ""]
    if ttft is None:
        out.append(f"skipped: {skipped}")
        return "\n".join(out)
    out += ["| path | p50 | p99 | mean |", "|---|---|---|---|"]
    for name, p in ttft.items():
        out.append(f"| {name} | {p['p50']:.3f} | {p['p99']:.3f} | {p['mean']:.3f} |")
    delta = ttft["warmgate"]["p50"] - ttft["direct"]["p50"]
    out += [
        "",
        f"warmgate's API adds {delta:+.3f} ms at p50 "
        f"({ttft['warmgate']['p99'] - ttft['direct']['p99']:+.3f} ms at p99); the plain proxy "
        "route to the same server is shown for comparison.",
    ]
    return "\n".join(out)


@section("policy")
def run(ctx: Ctx) -> SectionResult:
    n_decide = 20_000 if ctx.opts.quick else 200_000
    n_ttft = 300 if ctx.opts.quick else 2000
    with _pinned(ctx.proxy_cpus):
        decisions = asyncio.run(_decision_times(n_decide))
    ctx.log(
        f"  decide p99 {decisions['decide']['p99']:.1f} µs, "
        f"snapshot+decide p99 {decisions['snapshot+decide']['p99']:.1f} µs"
    )
    ttft: dict[str, dict[str, float]] | None = None
    skipped = None
    try:
        with Procs(ctx.workdir) as procs:
            urls = _start(ctx, procs)
            with _pinned(ctx.load_cpus):
                ttft = asyncio.run(_ttft(urls, n_ttft))
    except StartError as exc:
        skipped = str(exc).splitlines()[0]
        ctx.log(f"!! skipping TTFT: {exc}")
    if ttft is not None:
        ctx.log(
            f"  TTFT p50 direct {ttft['direct']['p50']:.3f} ms, "
            f"warmgate {ttft['warmgate']['p50']:.3f} ms"
        )
    p99 = decisions["decide"]["p99"]
    full = decisions["snapshot+decide"]["p99"]
    delta = None if ttft is None else ttft["warmgate"]["p50"] - ttft["direct"]["p50"]
    goals = [
        Goal(
            "decide p99, 50 models x 4 placements (µs)",
            p99,
            f"<= {DECIDE_GOAL_US:g} µs",
            p99 <= DECIDE_GOAL_US,
        ),
        Goal(
            "snapshot + decide p99, same (µs)",
            full,
            f"<= {DECIDE_GOAL_US:g} µs",
            full <= DECIDE_GOAL_US,
        ),
        Goal(
            "TTFT p50, warmgate - direct (ms)",
            delta,
            f"<= +{TTFT_GOAL_MS:g} ms",
            None if delta is None else delta <= TTFT_GOAL_MS,
        ),
    ]
    data = {
        "decisions": decisions,
        "ttft": ttft,
        "skipped": skipped,
        "n": {"decide": n_decide, "ttft": n_ttft},
    }
    return SectionResult(render(decisions, ttft, skipped), data, goals)
