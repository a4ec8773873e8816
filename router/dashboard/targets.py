"""The dashboard's targets section, a card for each target (its phase, what it does, what
comes next, its day), and its GPU pools section."""

from __future__ import annotations

from router.dashboard import charts
from router.dashboard.markup import READ_ONLY, Json, countdown, dl, e, since, span


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
        f'<p class="reason">{e(t["reason"])}</p>{dl(rows)}{_actions(name, t, actions)}'
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
            f"{dl(rows)}<h4>Waiting</h4><ul>{waiting}</ul></article>"
        )
    return (
        f'<section id="pools"><h2>GPU pools</h2><div class="cards">{"".join(cards)}</div></section>'
    )
