"""The dashboard's API section: the day's cloud spend against the budget, and each model's
placement decisions and time to first token."""

from __future__ import annotations

from router.dashboard import charts
from router.dashboard.day import midnight
from router.dashboard.markup import Json, e


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
