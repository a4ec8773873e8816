"""``GET /`` on the admin listener: the dashboard, rendered on the server from the view (so it
reads the same with JavaScript off), with its script and style served as package data from
``router/static/``. The script follows ``GET /events`` and swaps in ``GET /?fragment=1`` (the
same rendering, without the page around it) whenever the view changes. Its sections:
:mod:`router.dashboard.targets` (and the GPU pools), the day's charts
(:mod:`router.dashboard.charts`), :mod:`router.dashboard.api`, and here the replicas and the
events."""

from __future__ import annotations

from aiohttp import web

from router.dashboard import charts, view
from router.dashboard.api import api_section
from router.dashboard.markup import READ_ONLY, Json, clock, e, iso, since
from router.dashboard.stream import PUBLISHER
from router.dashboard.targets import pools_section, target_card


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
        f'<li class="ev {e(ev["kind"])}"><time datetime="{e(iso(ev["at"]))}" '
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
