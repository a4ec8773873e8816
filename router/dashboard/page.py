"""``GET /`` on the admin listener: the dashboard, rendered on the server from the view (so it
reads the same with JavaScript off), with its script and style served as package data from
``router/static/``. The script follows ``GET /events`` and swaps in ``GET /?fragment=1`` (the
same rendering, without the page around it) whenever the view changes."""

from __future__ import annotations

import datetime
import html
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web

from router.dashboard import charts, view
from router.dashboard.day import midnight
from router.dashboard.stream import PUBLISHER

Json = Mapping[str, Any]
READ_ONLY = "read-only: actions need admin.token_file in warmgate's config"


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def clock(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%H:%M:%S UTC")


span = charts.duration


def since(epoch: float | None, now: float) -> str:
    """A moment: its time, and how long ago (which the script keeps current)."""
    if epoch is None:
        return "-"
    return (
        f'<time datetime="{e(_iso(epoch))}" data-epoch="{epoch}">{clock(epoch)}</time> '
        f'(<span class="ago" data-epoch="{epoch}">{span(now - epoch)} ago</span>)'
    )


def countdown(epoch: float, now: float) -> str:
    return f'<span class="countdown" data-epoch="{epoch}">{span(epoch - now)}</span>'


def _iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat(timespec="seconds")


def _dl(rows: Iterable[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


# -- targets ----------------------------------------------------------------------------------


def _activity(t: Json, now: float) -> str:
    a = t["activity"]
    parts = []
    if a["requests"]:
        parts.append(f"{a['requests']} in flight")
    if a["streams"]:
        active = " (carrying traffic)" if a["streams_active"] else ""
        parts.append(f"{a['streams']} stream{'s' if a['streams'] != 1 else ''}{active}")
    if a["engine_busy"]:
        parts.append("the engine reports work")
    if a["wanted"]:
        parts.append("asked to warm up")
    if not parts and t["phase"] in ("ready", "draining"):
        idle = t["idle_since"]
        parts.append("idle" if idle is None else f"idle since {since(idle, now)}")
    return ", ".join(parts) or "-"  # fixed words and times: nothing to escape


def idle_after(t: Json) -> str:
    """``idle_after`` as in force, and for ``auto`` what it was learned from (fixed words and
    numbers: nothing to escape)."""
    shown = span(t["idle_after"])
    learned = (t.get("idle") or {}).get("learned")
    if learned is None:
        return shown
    if learned["learned"]:
        return f"{shown}, learned from {_gaps(learned['gaps'])}"
    seen, needed = learned["gaps"], learned["gaps_needed"]
    return f"{shown}, auto: the upper bound until {_gaps(needed)} ({seen} seen)"


def _gaps(n: int) -> str:
    return "1 gap" if n == 1 else f"{n} gaps"


def _idle_of(t: Json, now: float) -> str:
    """How long the target has been idle, of the ``idle_after`` that releases it (the setting
    is not the idle time: idle 13 s of 10 minutes)."""
    idle = t["idle_since"]
    if idle is None:
        return f"once idle for {idle_after(t)}"
    elapsed = f'<span class="elapsed" data-epoch="{idle}">{span(now - idle)}</span>'
    return f"idle for {elapsed} of idle_after {idle_after(t)}"


def _next(t: Json, now: float) -> tuple[str, str]:
    if t["always_on"]:
        return "Release", "never (always on)"
    if t["park_at"] is not None and (t["release_at"] is None or t["park_at"] < t["release_at"]):
        return "Park", f"in {countdown(t['park_at'], now)} (then release in " + (
            f"{countdown(t['release_at'], now)})" if t["release_at"] is not None else "-)"
        )
    if t["release_at"] is not None:
        return "Release", f"in {countdown(t['release_at'], now)} ({_idle_of(t, now)})"
    if t["retry_at"] is not None:
        return "Next try", f"in {countdown(t['retry_at'], now)}"
    if t["park_at"] is not None:
        return "Park", f"in {countdown(t['park_at'], now)}"
    if t["phase"] == "ready":
        return "Release", f"once idle for {idle_after(t)}"
    return "Release", "-"


def _starts(t: Json, now: float) -> str:
    starts = t["cold_starts_today"]
    shown = []
    for s in starts[-8:]:
        if s["outcome"] == "ready":
            shown.append(f"{s['seconds']:.1f}s")
        elif s["outcome"] == "starting":
            shown.append(f'<span class="elapsed" data-epoch="{s["at"]}">{span(now - s["at"])}'
                         "</span> so far")  # fmt: skip
        else:
            shown.append(f"{e(s['outcome'])} after {s['seconds']:.1f}s")
    more = f"… {len(starts) - 8} earlier, " if len(starts) > 8 else ""
    listed = f": {more}{', '.join(shown)}" if shown else ""
    eta = f" · ETA ~{span(t['eta'])}" if t["eta"] is not None else ""
    return f"{len(starts)}{listed}{eta}"


def _gpu(t: Json) -> str:
    """The GPU-seconds of the day's strip, as the day's chart stacks them (the same totals):
    busy, idle (draining included), parked, and starting (waking included)."""
    gpu = charts.gpu_seconds(t["gpu_hours_today"])
    parked = "" if t.get("parked") is None else f"{gpu['parked']:.0f} parked · "
    return (
        f'<span class="gpu-busy">{gpu["busy"]:.0f}</span> busy · '
        f'<span class="gpu-idle">{gpu["idle"]:.0f}</span> idle · {parked}'
        f'<span class="gpu-starting">{gpu["starting"]:.0f}</span> starting'
    )


def _actions(name: str, t: Json, allowed: bool) -> str:
    title = "" if allowed else f' disabled title="{e(READ_ONLY)}"'
    buttons = "".join(
        f'<button type="button" data-action="{a}" data-target="{e(name)}"{title}>{a.title()}'
        "</button>"
        for a in ("wake", "release", "park")
    )
    return f'<div class="actions">{buttons}</div>' if not t["always_on"] else ""


def _held(t: Json) -> str:
    held, in_flight = t["held"], t["in_flight"]
    return f'<span class="held">{held}</span> / <span class="in-flight">{in_flight}</span>'


def target_card(name: str, t: Json, now: float, actions: bool) -> str:
    phase = t["phase"]
    # A start in its "starting" stage would show the same word twice: the phase says it.
    shown = t.get("stage") if t.get("stage") != phase else None
    stage = f' <span class="stage">{e(shown)}</span>' if shown else ""
    failure = t["last_failure"]
    rows = [
        ("Since", since(t["since"], now)),
        ("Endpoints", e(", ".join(t["endpoints"])) or "-"),
        ("Held / in flight", _held(t)),
        ("Activity", _activity(t, now)),
        _next(t, now),
        ("Cold starts today", _starts(t, now)),
        ("GPU-seconds today", _gpu(t)),
        (
            "Last failure",
            "-" if failure is None else f"{e(failure['reason'])} at {since(failure['at'], now)}",
        ),
        ("Runs as", f"{e(t['backend'])} · {e(t['engine'])}"),
    ]
    if t.get("parked") is not None:
        rows.insert(4, ("Parked tier", _parked(t["parked"], now)))
    loop = t.get("lifecycle") or {}
    if loop.get("last_error") is not None or loop.get("running") is False:
        rows.append(("Lifecycle", _loop(loop, now)))
    if t.get("waiting_for"):
        rows.insert(3, ("Waiting for", e(t["waiting_for"])))
    return (
        f'<article class="card target" id="target-{e(name)}" data-phase="{e(phase)}">'
        f'<header><h3>{e(name)}</h3> <span class="phase">{e(phase)}</span>{stage}</header>'
        f'<p class="reason">{e(t["reason"])}</p>{_dl(rows)}{_actions(name, t, actions)}'
        "</article>"
    )


def _loop(loop: Json, now: float) -> str:
    """The target's lifecycle loop, shown once it failed or stopped (docs/operations.md)."""
    state = "running" if loop["running"] else "not running"
    error = loop["last_error"]
    if error is None:
        return state
    repeats = f" ({error['repeats']}x in a row)" if error["repeats"] > 1 else ""
    return (
        f"{state}; {e(error['step'])} failed {since(error['at'], now)}{repeats}: "
        f'<span class="muted">{e(error["error"])}</span>'
    )


def _parked(p: Json, now: float) -> str:
    """The parked tier of a target whose engine can be parked (docs/pools.md)."""
    if p["waking"]:
        state = "waking"
    elif p["parking"]:
        state = "being parked"
    elif p["parked"]:
        state = f"parked since {since(p['since'], now)}"
    else:
        state = "not parked"
    after = f" · park after {span(p['park_after'])}" if p["park_after"] else ""
    wake = "?" if p["wake_eta"] is None else f"{p['wake_eta']:.1f}"
    return f"{state}{after} · a wake takes ~{wake}s"  # fixed words, times, numbers


def pools_section(pools: Json) -> str:
    """Each GPU pool: who holds its GPUs, who is parked, who waits and for what."""
    cards = []
    for name, p in pools.items():
        waiting = (
            "".join(f"<li><b>{e(t)}</b> {e(why)}</li>" for t, why in p["waiting"].items())
            or "<li>nobody</li>"
        )
        rows = [
            ("Resident", f"{len(p['resident'])} of {p['capacity']}: "
             f"{e(', '.join(p['resident'])) or '-'}"),
            ("Parked", e(", ".join(p["parked"])) or "-"),
            ("Yields after", span(p["yield_after"])),
        ]  # fmt: skip
        cards.append(
            f'<article class="card pool" id="pool-{e(name)}"><header><h3>{e(name)}</h3></header>'
            f"{_dl(rows)}<h4>Waiting</h4><ul>{waiting}</ul></article>"
        )
    return (
        f'<section id="pools"><h2>GPU pools</h2><div class="cards">{"".join(cards)}</div></section>'
    )


# -- API, replicas, events --------------------------------------------------------------------


def usd(value: float) -> str:
    return f"${value:.4f}" if 0 < value < 0.01 else f"${value:,.2f}"


def _bars(decisions: list[Json]) -> str:
    if not decisions:
        return '<p class="muted">no decisions in the last hour</p>'
    top = max(d["count"] for d in decisions)
    rows = "".join(
        f'<li class="{e(d["where"])}"><span class="label"><b>{e(d["placement"])}</b> '
        f'{e(d["reason"])}</span><span class="bar"><span style="width:'
        f'{100 * d["count"] / top:.0f}%"></span></span><span class="n">{d["count"]}</span></li>'
        for d in decisions
    )
    return f'<ul class="bars">{rows}</ul>'


def _ttft(ttft: Json | None) -> str:
    """p50/p95 local vs cloud, once warmgate measures it."""
    if ttft is None:
        return "not measured yet"
    return " · ".join(
        f'<span class="ttft-{e(where)}">{e(where)} p50 {v["p50"]:.2f}s, p95 {v["p95"]:.2f}s'
        f" ({v['n']} answers)</span>"
        for where, v in ttft.items()
    )


def _per_model(api: Json, b: Json, now: float) -> str:
    by_model = api["spend_today_by_model"]
    said = ", ".join(f"{e(m)} {usd(v)}" for m, v in by_model.items()) or "nothing yet"
    chart = charts.spend(api["spend_line_by_model"], b["limit"], midnight(now), now)
    return f'{chart}<p class="muted spend-by-model">{said}</p>'


def api_section(api: Json, now: float) -> str:
    b = api["budget"]
    used = b["limit"] - b["left"]
    share = min(100.0, 100 * used / b["limit"]) if b["limit"] else 0.0
    clouds = ", ".join(f"{e(c)} {usd(v)}" for c, v in api["spend_today_by_cloud"].items())
    head = (
        f'<div class="card budget"><h3>Cloud spend today ({e(b["day"])}, UTC)</h3>'
        f'<p><b class="spent">{usd(b["spent"])}</b> spent of {usd(b["limit"])} · '
        f"{usd(b['reserved'])} reserved by {b['open_reservations']} open reservations · "
        f"{usd(b['left'])} left</p>"
        f'<span class="bar budget-bar"><span style="width:{share:.1f}%"></span></span>'
        f'<p class="muted">{clouds or "nothing spent in a cloud yet"}</p>'
        f"<h4>Per model, over the day</h4>{_per_model(api, b, now)}</div>"
    )
    models = "".join(
        f'<article class="card model" id="model-{e(name)}"><header><h3>{e(name)}</h3> '
        f'<span class="kind">{e(m["kind"])}</span></header>'
        f'<p class="muted">{e(", ".join(m["placements"]))}</p>'
        f"<h4>Decisions, last hour</h4>{_bars(m['decisions_last_hour'])}"
        f'<p class="muted">Time to first token: {_ttft(m["ttft"])}</p></article>'
        for name, m in api["models"].items()
    )
    return f'<section id="api"><h2>API</h2><div class="cards">{head}{models}</div></section>'


def replicas_section(r: Json, now: float) -> str:
    rows = [
        f"<tr><td>{e(r['self'])} (this one)</td><td>{'leader' if r['leading'] else '-'}</td>"
        f"<td>yes</td><td>now</td></tr>"
    ]
    for p in r["peers"]:
        heard = since(p["heard_at"], now) if p["heard_at"] is not None else "never"
        reach = "yes" if p["reachable"] else f"no{': ' + e(p['error']) if p['error'] else ''}"
        rows.append(f"<tr><td>{e(p['name'])}</td><td></td><td>{reach}</td><td>{heard}</td></tr>")
    problems = "".join(f'<p class="warn">{e(p)}</p>' for p in r["problems"])
    return (
        '<section id="replicas"><h2>Replicas</h2>' + problems + '<div class="scroll"><table>'
        "<tr><th>Replica</th><th>Leader</th><th>Reachable</th><th>Last heard</th></tr>"
        + "".join(rows) + "</table></div></section>"
    )  # fmt: skip


def _moved(ev: Json) -> bool:
    """The event changed the phase (a wake begins in ``parked`` and stays there until ready)."""
    return bool(ev["from"]) and ev["from"] != ev["phase"]


def events_section(events: list[Json]) -> str:
    items = "".join(
        f'<li class="ev {e(ev["kind"])}"><time datetime="{e(_iso(ev["at"]))}" '
        f'data-epoch="{ev["at"]}">{clock(ev["at"])}</time> '
        f"<b>{e(ev['target'] or 'warmgate')}</b> {e(ev['kind'])}"
        + (f" ({e(ev['from'])} → {e(ev['phase'])})" if _moved(ev) else "")
        + f' <span class="muted">{e(ev["reason"])}</span></li>'
        for ev in events
    )
    empty = '<p class="muted">nothing happened yet</p>' if not events else ""
    return f'<section id="events"><h2>Events</h2>{empty}<ol class="events">{items}</ol></section>'


def fragment(v: Json) -> str:
    now = v["now"]
    cards = "".join(target_card(name, t, now, v["actions"]) for name, t in v["targets"].items())
    parts = [f'<section id="targets"><h2>Targets</h2><div class="cards">{cards}</div></section>']
    parts.append(charts.day_section(v))
    if v.get("pools"):
        parts.append(pools_section(v["pools"]))
    if v["api"] is not None:
        parts.append(api_section(v["api"], now))
    if v["replicas"] is not None:
        parts.append(replicas_section(v["replicas"], now))
    parts.append(events_section(v["events"]))
    return "".join(parts)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<noscript><meta http-equiv="refresh" content="10"></noscript>
<title>warmgate{title}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/dashboard.css">
</head><body data-actions="{actions}">
<header class="top"><h1>warmgate{title}</h1>
<span id="live" class="live off">as of {at}</span>
<form id="token-form" hidden><label>Admin token
<input id="token" type="password" autocomplete="off" required></label>
<button type="submit">Use</button></form>
<p id="notice" role="status">{notice}</p></header>
<main id="view" data-now="{now}">{fragment}</main>
<footer class="foot"><noscript><p class="muted">JavaScript is off: the page reloads every 10 s.</p>
</noscript></footer>
<script src="/static/dashboard.js"></script>
</body></html>
"""


async def dashboard(request: web.Request) -> web.Response:
    v = view.snapshot(request.app[PUBLISHER].src)
    headers = {"Cache-Control": "no-store"}
    if request.query.get("fragment"):
        return web.Response(
            text=fragment(v), content_type="text/html", headers={**headers, "X-Now": str(v["now"])}
        )
    replica = f" · {v['replica']}" if v["replica"] else ""
    body = PAGE.format(
        title=e(replica),
        actions="1" if v["actions"] else "0",
        at=clock(v["now"]),
        notice="" if v["actions"] else e(READ_ONLY.capitalize()),
        now=v["now"],
        fragment=fragment(v),
    )
    return web.Response(text=body, content_type="text/html", headers=headers)
