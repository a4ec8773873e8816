"""A 20-second headless locust run against the demo stack: no failed and no unanswered request."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT


def test_locust_smoke_against_the_demo_stack(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtests.loadtest",
            "--duration",
            "20",
            "--users",
            "10",
            "--spawn-rate",
            "5",
            "--idle-after",
            "10s",
            "--out",
            str(tmp_path),
            "--prefix",
            "smoke",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    with (tmp_path / "smoke_stats.csv").open() as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    assert int(rows[("", "Aggregated")]["Failure Count"]) == 0
    names = {name for _, name in rows}
    for expected in ("page", "asset", "/prompt", "render until done", "/view", "images"):
        assert expected in names, sorted(names)
    assert "chat (stream, time to first token)" in names
    assert any(kind == "DECISION" for kind, _ in rows), "routing decisions are recorded"
    summary = (tmp_path / "smoke-summary.md").read_text()
    sent = int(summary.split("requests sent ")[1].split(",")[0])
    answered = int(summary.split("answered ")[1].split()[0])
    assert sent == answered > 0
    assert (tmp_path / "smoke.html").exists()
