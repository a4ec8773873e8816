"""``make loadtest``: the demo stack under locust, headless, for a bounded time.

Starts a local OpenAI-compatible server standing in for the cloud, then warmgate with the demo
render engine (engine: comfyui) and a local OpenAI-compatible model server as process targets,
runs locust, writes CSV and locust's HTML report under loadtests/results/, prints p50/p95/p99
per request type, stops everything it started, and exits non-zero on any failed or unanswered
request.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from loadtests.harness import PYTHON, RESULTS_DIR, ROOT, Procs, free_port

CLOUD_KEY_ENV = "LOADTEST_CLOUD_KEY"


def stack_config(port: int, admin: int, cloud: int, idle_after: str) -> dict[str, Any]:
    scaling = {"idle_after": idle_after, "cold_start_timeout": "2m", "max_held": 5000}
    return {
        "listen": f"127.0.0.1:{port}",
        "admin_listen": f"127.0.0.1:{admin}",
        "server": {"access_log": False},
        "targets": {
            "demo": {
                "engine": "comfyui",
                "routes": [{"path_prefix": "/"}],
                "backend": {
                    "kind": "process",
                    "command": [
                        "python",
                        "-m",
                        "backends.demo_engine",
                        "--port",
                        "{port}",
                        "--checkpoint-size",
                        "64MiB",
                        "--render-seconds",
                        "1",
                    ],
                    "cwd": str(ROOT),
                },
                "scaling": scaling,
            },
            "llm": {
                "engine": "openai",
                "routes": [{"path_prefix": "/llm", "strip_prefix": True}],
                "backend": {
                    "kind": "process",
                    "command": [
                        "python",
                        "-m",
                        "tests.fake_openai",
                        "--port",
                        "{port}",
                        "--startup-delay",
                        "2",
                        "--chunk-delay",
                        "0.01",
                    ],
                    "cwd": str(ROOT),
                },
                "scaling": scaling,
            },
        },
        "models": {
            "qwen3-8b": {
                "placements": [
                    {"target": "llm", "cost_per_gpu_second": 0.0008},
                    {
                        "cloud": "managed",
                        "model": "frontier-large",
                        "cost": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
                    },
                ]
            },
            "flux-dev": {
                "kind": "images",
                "placements": [
                    {
                        "target": "demo",
                        "workflow": str(ROOT / "deploy/local/workflows/flux_dev.json"),
                    },
                    {"cloud": "managed", "model": "image-large", "cost": {"per_image": 0.04}},
                ],
            },
        },
        "clouds": {
            "managed": {"base_url": f"http://127.0.0.1:{cloud}/v1", "api_key_env": CLOUD_KEY_ENV}
        },
        "policy": {"max_wait": "10s", "daily_cloud_budget_usd": 50, "warm_on_cloud": True},
        "api": {"allow_anonymous": True},  # locust's users carry no keys; the cloud is a fake
    }


def percentiles(stats_csv: Path) -> list[dict[str, str]]:
    with stats_csv.open() as f:
        return [row for row in csv.DictReader(f) if row["Name"] != "Aggregated"]


def summary(rows: list[dict[str, str]], counts: dict[str, int]) -> str:
    lines = [
        "| type | name | requests | failures | p50 ms | p95 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in sorted(rows, key=lambda r: (r["Type"], r["Name"])):
        lines.append(
            f"| {row['Type']} | {row['Name']} | {row['Request Count']} | {row['Failure Count']} "
            f"| {row['50%']} | {row['95%']} | {row['99%']} |"
        )
    lines.append("")
    lines.append(f"requests sent {counts.get('sent', 0)}, answered {counts.get('answered', 0)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=int, default=90, help="seconds of traffic")
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--spawn-rate", type=float, default=10)
    parser.add_argument("--shape", choices=("idle-then-burst", "none"), default="idle-then-burst")
    parser.add_argument("--idle-after", default="20s", help="the targets' idle_after")
    parser.add_argument("--classes", nargs="*", default=["RenderUIUser", "OpenAIUser"])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--prefix", default="locust")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="warmgate-loadtest-"))
    port, admin, cloud = free_port(), free_port(), free_port()
    os.environ[CLOUD_KEY_ENV] = "sk-loadtest-cloud-key"
    config = workdir / "warmgate.yaml"
    config.write_text(yaml.safe_dump(stack_config(port, admin, cloud, args.idle_after)))
    counts_file = workdir / "counts.json"
    prefix = args.out / args.prefix
    with Procs(workdir) as procs:
        procs.start("cloud", [PYTHON, "-m", "tests.fake_openai", "--port", str(cloud)])
        procs.wait_http("cloud", cloud, "/v1/models")
        procs.start("warmgate", [PYTHON, "-m", "router", "serve", "--config", str(config)])
        procs.wait_http("warmgate", admin, "/readyz")
        env = {
            **os.environ,
            "WARMGATE_ADMIN": f"http://127.0.0.1:{admin}",
            "WARMGATE_COUNTS_FILE": str(counts_file),
            "WARMGATE_SHAPE": args.shape,
            "WARMGATE_BURST_USERS": str(args.users),
            "WARMGATE_STEADY_USERS": str(max(1, args.users // 5)),
            "WARMGATE_BURST_HOLD_SECONDS": str(max(5, args.duration // 3)),
            "WARMGATE_TRAFFIC_SECONDS": str(args.duration),
        }
        started = time.monotonic()
        locust = subprocess.run(
            [
                PYTHON,
                "-m",
                "locust",
                "-f",
                str(ROOT / "loadtests/locustfile.py"),
                "--headless",
                "-u",
                str(args.users),
                "-r",
                str(args.spawn_rate),
                "-t",  # with the shape, it ends the run itself after --duration of traffic
                f"{args.duration + 600}s" if args.shape != "none" else f"{args.duration}s",
                "--stop-timeout",
                "120",
                "--host",
                f"http://127.0.0.1:{port}",
                "--csv",
                str(prefix),
                "--html",
                f"{prefix}.html",
                "--only-summary",
                "--exit-code-on-error",
                "1",
                *args.classes,
            ],
            env=env,
            cwd=ROOT,
            check=False,
        )
        elapsed = time.monotonic() - started
        (args.out / f"{args.prefix}-warmgate.log").write_text(procs.log_tail("warmgate", 400))
    counts = json.loads(counts_file.read_text()) if counts_file.exists() else {}
    rows = percentiles(Path(f"{prefix}_stats.csv"))
    report = summary(rows, counts)
    (args.out / f"{args.prefix}-summary.md").write_text(report + "\n")
    print(report)
    print(f"\nlocust exit code {locust.returncode}, {elapsed:.0f}s; results in {args.out}")
    failures = sum(int(r["Failure Count"]) for r in rows)
    unanswered = counts.get("sent", 0) - counts.get("answered", 0)
    if failures or unanswered or locust.returncode not in (0,):
        print(f"FAILED: {failures} failed, {unanswered} unanswered", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
