"""``warmgate status``: the targets and models of a running warmgate, read from its admin
listener (``GET /status``), as a table like ``kubectl get`` or as JSON for scripts."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any, TextIO

from router.dashboard import charts

DEFAULT_ADMIN = "http://127.0.0.1:9090"
"""The config's default admin_listen."""
TIMEOUT = 5.0
"""Seconds one read of the admin listener may take."""


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""No proxies from the environment: the admin listener is reached directly."""


class Unreachable(Exception):
    """The admin listener did not answer (one line, for the terminal)."""


def admin_url(args: argparse.Namespace) -> str:
    if args.admin:
        url = str(args.admin)
        return (url if "://" in url else "http://" + url).rstrip("/")
    if args.config:
        from router.config import load_config  # only when asked: it validates the whole file

        listen = load_config(args.config).admin_listen
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(listen.host, listen.host)
        return f"http://[{host}]:{listen.port}" if ":" in host else f"http://{host}:{listen.port}"
    return DEFAULT_ADMIN


def fetch(admin: str) -> dict[str, Any]:
    url = admin + "/status"
    try:
        with _OPENER.open(url, timeout=TIMEOUT) as response:
            body = json.load(response)
    except urllib.error.HTTPError as exc:
        raise Unreachable(f"{url} answered {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        reason = getattr(exc.reason, "strerror", None) or str(exc.reason)
        raise Unreachable(f"cannot reach the admin listener at {admin}: {reason}") from None
    except (OSError, ValueError) as exc:
        raise Unreachable(f"cannot read {url}: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("targets"), dict):
        raise Unreachable(f"{url} did not answer warmgate's status")
    return body


def duration(seconds: float | None) -> str:
    return "-" if seconds is None else charts.duration(seconds)


def usd(value: float) -> str:
    return f"${value:,.2f}"


def table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def _idle(t: dict[str, Any], now: float) -> str:
    if t["phase"] not in ("ready", "draining", "parked"):
        return "-"
    return "active" if t["idle_since"] is None else duration(now - t["idle_since"])


def _eta(t: dict[str, Any], now: float) -> str:
    eta = t.get("eta")
    parked = t.get("parked")
    if t["phase"] == "parked" and parked:  # a wake, not a cold start
        wake = parked["wake_eta"]
        if parked.get("waking") and t["since"] is not None and wake is not None:
            return f"~{duration(max(0.0, wake - (now - t['since'])))} left"
        return f"~{duration(parked['wake_eta'])}"
    if eta is None or t["phase"] not in ("cold", "starting", "failed"):
        return "-"
    if t["phase"] == "starting" and t["since"] is not None:
        return f"~{duration(max(0.0, eta - (now - t['since'])))} left"
    return f"~{duration(eta)}"


def _gpu(t: dict[str, Any]) -> str:
    """GPU-seconds today as the dashboard counts them (its strip: busy, idle, parked and
    starting); a warmgate older than that: its counter's (no starting time)."""
    hours = t.get("gpu_hours_today")
    if isinstance(hours, dict):
        gpu = {key: 3600 * float(value or 0.0) for key, value in hours.items()}
    else:
        gpu = {key: float(value or 0.0) for key, value in t["gpu_seconds_today"].items()}
    total = sum(gpu.values())
    return f"{total:.0f} ({gpu.get('busy', 0.0):.0f} busy)" if total else "0"


def _ttft(ttft: dict[str, Any] | None) -> str:
    """``local 0.42/1.30s cloud 0.80/2.10s``: p50/p95 of the window; ``-`` before any."""
    if not ttft:
        return "-"
    return " ".join(f"{where} {v['p50']:.2f}/{v['p95']:.2f}s" for where, v in ttft.items())


def render(view: dict[str, Any], out: TextIO) -> None:
    now = float(view.get("now") or time.time())
    rows: list[tuple[str, ...]] = [
        ("NAME", "PHASE", "STAGE", "HELD", "IN-FLIGHT", "IDLE", "GPU-S TODAY", "ETA")
    ]
    for name, t in view["targets"].items():
        rows.append(
            (
                name,
                t["phase"],
                t.get("stage") or "-",
                str(t["held"]),
                str(t["in_flight"]),
                _idle(t, now),
                _gpu(t),
                _eta(t, now),
            )
        )
    table(rows, out)
    api = view.get("api")
    if not api:
        return
    spend = api["spend_today_by_cloud"]
    print(file=out)
    rows = [("MODEL", "KIND", "DECISIONS (1H)", "CLOUD SPEND TODAY", "TTFT P50/P95", "PLACEMENTS")]
    decisions: dict[str, int]
    for name, m in api["models"].items():
        decisions = {}
        for d in m["decisions_last_hour"]:
            decisions[d["placement"]] = decisions.get(d["placement"], 0) + d["count"]
        said = " ".join(f"{p}:{n}" for p, n in decisions.items()) or "-"
        clouds = " ".join(f"{c} {usd(spend.get(c, 0.0))}" for c in m["clouds"]) or "-"
        placements = ", ".join(m["placements"])
        rows.append((str(name), str(m["kind"]), said, clouds, _ttft(m.get("ttft")), placements))
    table(rows, out)
    b = api["budget"]
    print(
        f"\ncloud budget {b['day']} (UTC): {usd(b['spent'])} spent, {usd(b['reserved'])} reserved "
        f"({b['open_reservations']} open) of {usd(b['limit'])}; {usd(b['left'])} left",
        file=out,
    )


def run(args: argparse.Namespace, *_: object) -> int:
    admin = admin_url(args)
    while True:
        try:
            view = fetch(admin)
        except Unreachable as exc:
            print(f"warmgate: {exc}", file=sys.stderr)
            if not args.watch:
                return 1
        else:
            if args.json:
                print(json.dumps(view, indent=None if args.watch else 2), flush=True)
            else:
                if args.watch and sys.stdout.isatty():
                    print("\033[H\033[2J", end="")
                render(view, sys.stdout)
                sys.stdout.flush()
        if not args.watch:
            return 0
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0


def add_command(commands: Any) -> None:
    """``warmgate status``, on the CLI's subcommands (``argparse``'s ``add_subparsers()``)."""
    command = commands.add_parser(
        "status", help="show the targets and models of a running warmgate (its admin listener)"
    )
    command.add_argument(
        "--admin", help=f"the admin listener's URL or HOST:PORT; default {DEFAULT_ADMIN}"
    )
    command.add_argument("--config", "-c", help="take the admin listener from this config file")
    command.add_argument("--watch", "-w", action="store_true", help="show again every --interval")
    command.add_argument(
        "--interval", type=float, default=2.0, help="seconds between two looks; default 2"
    )
    command.add_argument("--json", action="store_true", help="the admin listener's JSON")
    command.set_defaults(func=run)
