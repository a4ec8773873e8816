"""Shared bench plumbing: processes, ports, CPU pinning, RSS, wrk, sections, results.

A *section* is a function ``run(ctx) -> SectionResult`` registered with ``@section("name")``;
bench.py runs the selected sections in registration order and writes one report.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "loadtests" / "results"
PYTHON = sys.executable


# ---------------------------------------------------------------- options, context, sections
@dataclass
class Options:
    duration: int = 10
    warmup: int = 2
    connections: tuple[int, ...] = (16, 64, 256)
    held: int = 5000
    quick: bool = False
    only: frozenset[str] | None = None  # contender names; None = all

    def wants(self, name: str) -> bool:
        return self.only is None or name in self.only


@dataclass
class Goal:
    name: str
    value: float | None
    target: str
    ok: bool | None  # None: not measured in this run

    def line(self) -> str:
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[self.ok]
        shown = "n/a" if self.value is None else f"{self.value:.2f}"
        return f"| {self.name} | {shown} | {self.target} | {verdict} |"


@dataclass
class SectionResult:
    markdown: str
    data: dict[str, Any]
    goals: list[Goal] = field(default_factory=list)


@dataclass
class Ctx:
    opts: Options
    workdir: Path
    proxy_cpus: set[int] | None  # where the process under test runs
    load_cpus: set[int] | None  # load generators + upstream

    def log(self, msg: str) -> None:
        print(msg, flush=True)


SectionFn = Callable[[Ctx], SectionResult]
SECTIONS: dict[str, SectionFn] = {}


def section(name: str) -> Callable[[SectionFn], SectionFn]:
    def register(fn: SectionFn) -> SectionFn:
        SECTIONS[name] = fn
        return fn

    return register


# ---------------------------------------------------------------- limits, CPUs, ports, memory
def raise_nofile(needed: int = 0) -> int:
    """Raise RLIMIT_NOFILE to the hard limit (inherited by children); warn when below needed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < needed:
        print(
            f"!! RLIMIT_NOFILE hard limit {hard} < {needed} needed; raise it (ulimit -Hn, "
            f"/etc/security/limits.conf) or use fewer held requests",
            flush=True,
        )
    return hard


def cpu_layout() -> tuple[set[int] | None, set[int] | None]:
    """Process under test on the first CPU, load generator + upstream on the rest."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


def pin(pid: int, cpus: set[int] | None) -> None:
    """Pin every thread of pid and of its descendants (nginx workers) to cpus."""
    if cpus is None:
        return
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        for p in [proc, *proc.children(recursive=True)]:
            for t in p.threads():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(t.id, cpus)


def _affinity(cpus: set[int] | None) -> Callable[[], None] | None:
    """preexec_fn pinning a child (and all it later forks) to cpus."""
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


def rss_kb(pid: int) -> float:
    """RSS of pid plus all its descendants, in KiB."""
    proc = psutil.Process(pid)
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total / 1024


def held_row(
    n: int, held: int, out: Path, ramp_s: float, rss_before_kb: float, rss_held_kb: float
) -> dict[str, Any]:
    """One run of ``n`` held requests: what ``loadtests.held_client`` wrote to ``out`` (how
    many were answered 200, the errors) and the RSS it took per request held."""
    res: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"ok": 0, "errors": {}}
    kb = (rss_held_kb - rss_before_kb) / held if held else None
    return {
        "n": n,
        "held": held,
        "ok": res["ok"],
        "errors": res["errors"],
        "ramp_s": round(ramp_s, 2),
        "rss_before_mb": round(rss_before_kb / 1024, 1),
        "rss_held_mb": round(rss_held_kb / 1024, 1),
        "kb_per_held": kb and round(kb, 2),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def http_json(port: int, path: str) -> dict[str, Any]:
    status, body = http_get(port, path)
    if status != 200:
        raise RuntimeError(f"GET :{port}{path} -> {status}")
    result: dict[str, Any] = json.loads(body)
    return result


# ---------------------------------------------------------------- processes
class StartError(RuntimeError):
    pass


class Procs:
    """Processes started by a section; all killed by PID (with descendants) on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, name: str, argv: Sequence[str], cpus: set[int] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd or ROOT,
            start_new_session=True,
            preexec_fn=_affinity(cpus),
        )
        log.close()
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, n: int = 15) -> str:
        path = self.workdir / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-n:])

    def wait_http(self, name: str, port: int, path: str, timeout: float = 20.0) -> None:
        """Wait until GET path answers 200, or fail with the process's log tail."""
        proc, deadline, last = self.procs[name], time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise StartError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            try:
                status, _ = http_get(port, path, timeout=2)
                if status == 200:
                    return
                last = f"HTTP {status}"
            except OSError as e:
                last = repr(e)
            time.sleep(0.1)
        raise StartError(
            f"{name} not ready on :{port}{path} after {timeout}s ({last}):\n{self.log_tail(name)}"
        )

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            kill_tree(proc)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def kill_tree(proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for kid in kids:
        with contextlib.suppress(psutil.Error):
            kid.kill()


# ---------------------------------------------------------------- wrk
@dataclass
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int  # socket errors + non-2xx/3xx

    def cell(self) -> str:
        err = f" ⚠{self.errors} err" if self.errors else ""
        return f"{self.rps:,.0f} ({self.p50_ms:.2f}/{self.p99_ms:.2f} ms){err}"


_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    if not m:
        raise ValueError(f"bad wrk latency {text!r}")
    return float(m.group(1)) * _UNITS_MS[m.group(2)]


def parse_wrk(out: str) -> WrkResult:
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    reqs = re.search(r"(\d+) requests in", out)
    if not (rps and p50 and p99 and reqs):
        raise ValueError(f"cannot parse wrk output:\n{out}")
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors += int(non2xx.group(1)) if non2xx else 0
    return WrkResult(
        float(rps.group(1)), _ms(p50.group(1)), _ms(p99.group(1)), int(reqs.group(1)), errors
    )


def wrk(url: str, connections: int, seconds: int, cpus: set[int] | None) -> WrkResult:
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", url]
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=seconds + 30, preexec_fn=_affinity(cpus)
    )
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr or out.stdout}")
    return parse_wrk(out.stdout)


# ---------------------------------------------------------------- results
def write_report(meta: dict[str, Any], results: dict[str, SectionResult]) -> Path:
    goals = [g for r in results.values() for g in r.goals]
    lines = [
        f"# warmgate bench {meta['utc']}",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in meta.items()],
        "",
    ]
    for name, r in results.items():
        lines += [f"## {name}", "", r.markdown.rstrip(), ""]
    if goals:
        lines += [
            "## goals",
            "",
            "| goal | value | target | verdict |",
            "|---|---|---|---|",
            *[g.line() for g in goals],
            "",
        ]
    text = "\n".join(lines)
    data = {
        "meta": meta,
        "sections": {n: r.data for n, r in results.items()},
        "goals": [vars(g) for g in goals],
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = meta["utc"].replace(":", "").replace("-", "")
    for stem in (f"bench-{stamp}", "bench-latest"):
        (RESULTS_DIR / f"{stem}.md").write_text(text)
        (RESULTS_DIR / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n")
    print("\n" + text, flush=True)
    return RESULTS_DIR / f"bench-{stamp}.md"
