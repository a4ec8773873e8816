"""`make bench`: upstream direct vs warmgate vs a minimal aiohttp proxy vs nginx, in one run.

    python -m loadtests.bench [--quick] [--duration 10] [--only warmgate,minimal]
                              [--section proxy,held]

warmgate is $WARMGATE_BIN or the venv's `warmgate`; a contender that is missing or fails to
start is skipped with the reason. Sections live in their own modules and register with
@harness.section; add new ones to SECTION_MODULES.
Results: loadtests/results/bench-<UTC>.{md,json} and bench-latest.{md,json}.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from loadtests.contenders import NAMES
from loadtests.harness import (
    SECTIONS,
    Ctx,
    Options,
    SectionResult,
    cpu_layout,
    raise_nofile,
    write_report,
)

SECTION_MODULES = (
    "loadtests.bench_proxy",
    "loadtests.bench_held",
    "loadtests.bench_coldstart",
    "loadtests.bench_park",
    "loadtests.bench_policy",
    "loadtests.bench_simulate",
)


def parse_args(argv: list[str] | None) -> tuple[Options, list[str]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=int, help="seconds per wrk cell (default 10, quick 2)")
    ap.add_argument("--quick", action="store_true", help="smoke: 2s cells, c=16,64, 1000 held")
    ap.add_argument("--only", help=f"contenders, comma-separated, from {','.join(NAMES)}")
    ap.add_argument("--section", help=f"sections, comma-separated, from {','.join(SECTIONS)}")
    ap.add_argument("--held", type=int, help="requests held at once (default 5000, quick 1000)")
    a = ap.parse_args(argv)
    opts = Options(quick=a.quick)
    if a.quick:
        opts.duration, opts.warmup, opts.connections, opts.held = 2, 1, (16, 64), 1000
    opts.duration = a.duration or opts.duration
    opts.held = a.held or opts.held
    if a.only:
        opts.only = frozenset(a.only.split(","))
        if unknown := opts.only - set(NAMES):
            ap.error(f"unknown contender(s) {sorted(unknown)}; choose from {NAMES}")
    sections = a.section.split(",") if a.section else list(SECTIONS)
    if unknown_s := set(sections) - set(SECTIONS):
        ap.error(f"unknown section(s) {sorted(unknown_s)}; choose from {list(SECTIONS)}")
    return opts, sections


def version(argv: list[str]) -> str:
    if not shutil.which(argv[0]):
        return "missing"
    p = subprocess.run(argv, capture_output=True, text=True)
    return (p.stdout + p.stderr).strip().splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    for mod in SECTION_MODULES:
        importlib.import_module(mod)
    opts, sections = parse_args(argv)
    if not shutil.which("wrk"):
        print("!! wrk not found: apt-get install -y nginx wrk", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop every child
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    nofile = raise_nofile()
    proxy_cpus, load_cpus = cpu_layout()
    utc = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta: dict[str, Any] = {
        "utc": utc,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "pinning": f"under test on CPU {sorted(proxy_cpus)}, wrk+upstream+client on "
        f"{sorted(load_cpus)}"
        if proxy_cpus and load_cpus
        else "none (1 CPU)",
        "python": platform.python_version(),
        "nginx": version(["nginx", "-v"]),
        "wrk": version(["wrk", "-v"]),
        "RLIMIT_NOFILE": nofile,
        "cell": f"{opts.duration}s after {opts.warmup}s warm-up, wrk -t1",
        "connections": ",".join(map(str, opts.connections)),
        "held": opts.held,
        "loadavg at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "warmgate access log": "on"
        if os.environ.get("WARMGATE_ACCESS_LOG") == "1"
        else "off (like nginx and the minimal proxy here; WARMGATE_ACCESS_LOG=1 turns it on)",
    }
    if os.getloadavg()[0] > 0.5:
        print(f"!! machine busy (loadavg {meta['loadavg at start']}): figures will be noisy")
    results: dict[str, SectionResult] = {}
    with tempfile.TemporaryDirectory(prefix="warmgate-bench-") as tmp:
        ctx = Ctx(opts, Path(tmp), proxy_cpus, load_cpus)
        for name in sections:
            ctx.log(f"== section {name}")
            results[name] = SECTIONS[name](ctx)
    path = write_report(meta, results)
    print(f"wrote {path} and loadtests/results/bench-latest.{{md,json}}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\ninterrupted: every started process was stopped", file=sys.stderr)
        sys.exit(130)
