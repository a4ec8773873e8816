"""The waiting page: what a person sees while their target cold-starts.

A browser page load to a cold target gets this page at once (503, Retry-After, no-store) instead
of a spinner that times out. It names the target, shows elapsed time, an ETA learned from the
target's past cold starts (or, for a parked target, its past wakes: "Waking" rather than
"Starting"), what is left of a start under way, stage by stage where the stages were learned
("about 25 s left: downloading the engine image, then loading the model"), and a progress bar;
says what a start waits for in a full GPU pool ("waiting for the GPU: wan2gp is rendering") and
the stage of the start in words ("downloading the engine image", "loading the model": the
engine's own load progress drives the bar where it reports one; no ETA while no GPU in the
cluster is free); follows the phase through ``/.warmgate/status/<target>`` and reloads itself
when the target is ready. A failed start shows its reason in place of the bar. With
JavaScript off, a meta refresh does the same.
API clients are held, never shown this page.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import math
from collections.abc import Mapping

from aiohttp import web

from backends.base import RequestFacts
from router.errors import RequestError
from router.http.finite_json import dumps
from router.http.replies import error_response
from router.routing.match import RouteTable
from router.scale.state import Phase
from router.scale.targets import TargetRuntime

PREFIX = "/.warmgate/"

STAGE_WORDS = {
    "scheduling": "finding a GPU for it",
    "unschedulable": "waiting for a free GPU: all are busy with other work",
    "preempting": "freeing a GPU: lower-priority work is making room",
    "pulling": "downloading the engine image",
    "starting": "starting the engine",
    "loading": "loading the model",
}
"""What each stage of a start is, in a person's words (docs/operations.md)."""


def _waiting_for(runtime: TargetRuntime) -> str:
    """What a start or wake waits for in the target's full GPU pool (empty: nothing)."""
    state = runtime.state
    if state.waiting_for or runtime.pool is None or state.resident:
        return state.waiting_for
    wait = runtime.pool.wait_if_wanted(runtime.name)  # asked just now: the lifecycle is next
    return "" if wait is None else wait.reason


def status(runtime: TargetRuntime) -> dict[str, object]:
    state = runtime.state
    now = runtime.loop.time()
    phase = state.phase
    parked = phase is Phase.PARKED  # a wake, not a cold start, is what it takes
    moving = phase is Phase.STARTING or state.waking
    elapsed = now - state.since if moving else 0.0
    eta = runtime.learned.wakes.predicted() if parked else runtime.learned.predicted_cold_start()
    stage = state.stage if phase is Phase.STARTING else None
    remaining: float | None = eta
    by_stage: list[tuple[str, float]] = []
    if phase is Phase.STARTING:
        remaining = runtime.learned.eta(runtime.state)
        if stage is not None:
            by_stage = list(
                runtime.learned.cold_starts.left_by_stage(stage, now - state.stage_since)
            )
    elif moving:  # waking: what is left of the wake
        remaining = max(0.0, eta - elapsed)
    failed = phase is Phase.FAILED
    return {
        "target": runtime.name,
        "phase": phase.value,
        "ready": phase is Phase.READY,
        "waking": parked and state.waking,
        "parked": parked,
        "retrying": phase is Phase.STARTING and state.failures > 0,
        "waiting_for": _waiting_for(runtime) or None,
        "elapsed": round(elapsed, 2),
        "eta": round(eta, 2),
        "remaining": None if remaining is None else round(remaining, 2),
        "remaining_by_stage": [{"stage": s, "seconds": round(t, 2)} for s, t in by_stage],
        "expect_text": "" if failed else _expect(moving, eta, remaining, by_stage),
        "bar": None if failed else _bar(moving, eta, remaining, state.progress),
        "stage": stage,
        "stage_text": STAGE_WORDS.get(stage or ""),
        "stage_message": state.stage_message or None if stage is not None else None,
        "progress": None if state.progress is None else round(state.progress, 4),
        "retry_in": round(max(0.0, state.retry_at - now), 1) if failed else None,
        "failure": state.reason or "the start failed" if failed else None,
        "held": runtime.activity.held,
    }


def _expect(
    moving: bool, eta: float, remaining: float | None, by_stage: list[tuple[str, float]]
) -> str:
    """The line under the bar: what is left of a start or wake under way (and of which
    stages), the whole ETA before one began, or that nobody can tell."""
    if remaining is None:
        return "no ETA until a GPU is free"
    if not moving:
        return f"about {eta:.0f} s expected"
    stages = ", then ".join(STAGE_WORDS[stage] for stage, _ in by_stage)
    if remaining >= 0.5:
        text = f"about {remaining:.0f} s left"
    else:
        text = f"taking longer than the {eta:.0f} s expected"
    return f"{text}: {stages}" if stages else text


def _bar(moving: bool, eta: float, remaining: float | None, progress: float | None) -> float | None:
    """Percent of the bar: the engine's own load progress where it reports one, else the part
    of the expected time that is done (what is left against the whole; never full before
    ready); ``None`` while nobody can tell."""
    if progress is not None:
        return round(100 * progress, 1)
    if remaining is None:
        return None
    if not moving:
        return 0.0
    return round(min(95.0, 100 * (1 - remaining / max(remaining, eta, 1.0))), 1)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<noscript><meta http-equiv="refresh" content="{refresh}"></noscript>
<title>{title}</title>
<link rel="icon" href="{icon}">
<style>
body{{font:16px/1.5 system-ui,sans-serif;background:#111;color:#eee;display:grid;
place-items:center;min-height:100vh;margin:0}}
main{{width:min(32rem,90vw)}}h1{{font-size:1.3rem;margin:0 0 .5rem}}
.bar{{height:.6rem;background:#333;border-radius:.3rem;overflow:hidden;margin:1rem 0}}
.fill{{height:100%;width:{percent}%;background:#4c8;transition:width .4s}}
small{{color:#999}}
</style></head>
<body><main>
<h1 id="title">{headline}</h1>
<p id="phase">{text}</p>
<p id="pool"{pool_hidden}>{waiting_for}</p>
<p id="stage"{stage_hidden}>{stage_text}</p>
<div class="bar" id="bar"{bar_hidden}><div class="fill" id="fill"></div></div>
<p id="times"{times_hidden}><span id="elapsed">{elapsed}</span> s elapsed ·
<span id="expect">{expect}</span></p>
<small>warmgate · <span id="state">{phase}</span></small>
</main>
<script>
(function () {{
  var status = {status_json};
  var shownAt = Date.now() - status.elapsed * 1000;
  // wait=1: answered as soon as the target's state changes (at once once it is ready), else
  // after a second, so the page continues the moment it can without polling faster.
  var url = "/.warmgate/status/" + encodeURIComponent(status.target) + "?wait=1";
  var words = {words_json};
  function show(s) {{
    var elapsed = (Date.now() - shownAt) / 1000;
    document.getElementById("elapsed").textContent = elapsed.toFixed(0);
    document.getElementById("state").textContent = s.phase;
    var stage = document.getElementById("stage");
    stage.hidden = !s.stage_text;
    stage.textContent = s.stage_text ? s.stage_text.charAt(0).toUpperCase() +
      s.stage_text.slice(1) + (s.progress !== null ? " (" + Math.round(100 * s.progress) +
      "%)" : "") + "." + (s.stage_message ? " " + s.stage_message.charAt(0).toUpperCase() +
      s.stage_message.slice(1).replace(/[.]+$/, "") + "." : "") : "";
    document.getElementById("expect").textContent = s.expect_text;
    var pool = document.getElementById("pool");
    pool.hidden = !s.waiting_for;
    pool.textContent = s.waiting_for ? s.waiting_for.charAt(0).toUpperCase() +
      s.waiting_for.slice(1) + "." : "";
    var failed = s.phase === "failed";
    var verb = s.parked ? "Waking " : "Starting ";
    var name = document.createElement("b");
    name.textContent = s.target;
    document.getElementById("title").replaceChildren(failed ? "" : verb, name,
      failed ? " failed to start" : "");
    document.title = failed ? s.target + " failed to start" : verb + s.target + "\u2026";
    document.getElementById("bar").hidden = failed;
    document.getElementById("times").hidden = failed;
    if (s.bar !== null) {{ document.getElementById("fill").style.width = s.bar + "%"; }}
    document.getElementById("phase").textContent = !failed ?
      (s.phase === "cold" && words.reads ? words.asleep :
        s.parked ? words.waking : s.retrying ? words.retrying : words.starting) :
      "The workload failed to start: " + s.failure.replace(/[ .]+$/, "") +
      ". warmgate tries again" +
      (s.retry_in ? " in " + Math.ceil(s.retry_in) + " s." : ".");
  }}
  function poll() {{
    fetch(url, {{cache: "no-store"}}).then(function (r) {{ return r.json(); }})
      .then(function (s) {{
        status = s; show(s);
        if (s.ready) {{ location.reload(); }} else {{ poll(); }}
      }})
      .catch(function () {{ setTimeout(poll, 1000); }});
  }}
  setInterval(function () {{ show(status); }}, 1000);
  show(status); poll();
}})();
</script>
</body></html>
"""


_STARTING = """The GPU workload was asleep to leave the card free for others. It is loading its
model now; this page continues by itself when it is ready."""
_WAKING = """The GPU workload was parked: its model left the card for others, its process stayed.
It is loading the model back now (about a second); this page continues by itself."""
_RETRYING = """The GPU workload's last start failed; warmgate is starting it again now. This page
continues by itself when it is ready."""
_ASLEEP = """The GPU workload is asleep to leave the card free for others, and this address only
reads from it: it does not wake it. Open the app's own page to start it; this page continues by
itself once it is ready."""


def _stage_line(info: Mapping[str, object]) -> str:
    """The stage in words, with the engine's load progress where it reports one and the stage
    in its own words (the engine's, the cluster's) where it says any."""
    text = str(info["stage_text"] or "")
    if not text:
        return ""
    progress = info["progress"]
    done = f" ({100 * progress:.0f}%)" if isinstance(progress, float) else ""
    said = str(info["stage_message"] or "").rstrip(".")
    words = f" {said[:1].upper()}{said[1:]}." if said else ""
    return f"{text[:1].upper()}{text[1:]}{done}.{words}"


def _failed_text(info: Mapping[str, object]) -> str:
    retry = info["retry_in"]
    when = f" in {math.ceil(retry)} s" if isinstance(retry, float) and retry > 0 else ""
    why = str(info["failure"]).rstrip(" .")  # the sentence's own full stop follows
    return f"The workload failed to start: {why}. warmgate tries again{when}."


ICON = (
    "data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 16 16'%3E"
    "%3Ccircle cx='8' cy='8' r='6' fill='%2344cc88'/%3E%3C/svg%3E"
)
"""The page's own icon, inline: a browser that finds none asks the target for
``/favicon.ico``, a request held through the start for every tab that waits."""


def render(runtime: TargetRuntime, reads: bool = False) -> web.Response:
    """``reads``: the request only reads from the engine, and started nothing (it says so while
    the target stays cold)."""
    info = status(runtime)
    eta = float(info["eta"])  # type: ignore[arg-type]
    elapsed = float(info["elapsed"])  # type: ignore[arg-type]
    waiting_for = str(info["waiting_for"] or "")
    stage_text = _stage_line(info)
    bar = info["bar"]
    failed = info["phase"] == "failed"
    name = html.escape(runtime.name)
    verb = "Waking" if info["parked"] else "Starting"
    text = _WAKING if info["parked"] else _RETRYING if info["retrying"] else _STARTING
    if reads and info["phase"] == "cold":
        text = _ASLEEP
    body = _PAGE.format(
        title=f"{name} failed to start" if failed else f"{verb} {name}…",
        icon=ICON,
        headline=f"<b>{name}</b> failed to start" if failed else f"{verb} <b>{name}</b>",
        text=html.escape(_failed_text(info)) if failed else text,
        waiting_for=html.escape(
            waiting_for[:1].upper() + waiting_for[1:] + "." if waiting_for else ""
        ),
        pool_hidden="" if waiting_for else " hidden",
        stage_text=html.escape(stage_text),
        stage_hidden="" if stage_text else " hidden",
        bar_hidden=" hidden" if failed else "",
        times_hidden=" hidden" if failed else "",
        expect=html.escape(str(info["expect_text"])),
        refresh=3,
        percent=f"{bar if isinstance(bar, float) else 0.0:.1f}",
        elapsed=f"{elapsed:.0f}",
        phase=html.escape(str(info["phase"])),
        status_json=dumps(info).replace("<", "\\u003c"),
        words_json=dumps(
            {
                "starting": _STARTING,
                "waking": _WAKING,
                "retrying": _RETRYING,
                "asleep": _ASLEEP,
                "reads": reads,
            }
        ).replace("<", "\\u003c"),
    )
    retry = max(1, math.ceil(min(eta - elapsed, 10.0))) if eta > elapsed else 2
    return web.Response(
        status=503,
        text=body,
        content_type="text/html",
        headers={"Retry-After": str(retry), "Cache-Control": "no-store"},
    )


WAIT_MAX = 5.0
"""Longest a status request with ``?wait=`` is held (seconds): the page still shows the time
left and the stage in its own words while nothing changes."""


def _wait_seconds(raw: str | None) -> float:
    """``?wait=<seconds>``: answer once the state changes, or after that long (capped)."""
    try:
        wait = float(raw) if raw else 0.0
    except ValueError:
        return 0.0
    return min(max(wait, 0.0), WAIT_MAX) if math.isfinite(wait) else 0.0


class WaitingPages:
    """The dispatcher's hook: a page for browsers that load a page from a cold target."""

    def __init__(self, runtimes: Mapping[str, TargetRuntime], table: RouteTable) -> None:
        self.runtimes = runtimes
        self.table = table

    def __call__(
        self, request: web.Request, runtime: TargetRuntime, facts: RequestFacts
    ) -> web.StreamResponse | None:
        if runtime.spec.waiting_page != "auto" or not facts.is_navigation or facts.is_websocket:
            return None
        wakes = runtime.engine.may_start(facts)
        if wakes:
            runtime.request_start(waiting=True)
        elif runtime.state.phase is Phase.PARKED:
            return None  # a read its parked process answers (or a wake under way) is held
        return render(runtime, reads=not wakes)

    async def handle(self, request: web.Request) -> web.Response:
        """``/.warmgate/status/<target>``: the phase, for the page's polling. Never forwarded;
        only for a target that a route takes for this Host (another host's targets are not
        told, nor kept from being abandoned)."""
        name = request.match_info.get("target", "")
        runtime = self.runtimes.get(name)
        if (
            request.match_info.get("kind") != "status"
            or runtime is None
            or not self.table.serves_host(name, request.headers.get("Host"))
        ):
            raise web.HTTPNotFound(text="unknown warmgate page")
        # Someone still waits, with the page open: the start is not abandoned (a start kept so
        # is still bounded by cold_start_timeout, and a ready target is not kept by it).
        runtime.waited()
        answer = status(runtime)
        wait = _wait_seconds(request.query.get("wait"))
        if answer["ready"] or wait <= 0:
            # Ready before this poll came: no start's burst to pace it in, so it takes no turn
            # (anyone may poll; a turn taken by a poll that goes away would hold back a page).
            return _answer(answer)
        arrived, seen = runtime.loop.time(), runtime.state
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await runtime.cell.wait_for(lambda state: state is not seen)
        answer = status(runtime)
        if answer["ready"]:
            # A page that waited through the start continues: one of its burst, in line with
            # the held requests until its turn, for as long as a held request would be.
            try:
                await runtime.let_through(arrived + runtime.spec.scaling.cold_start_timeout)
            except RequestError as exc:
                return error_response(request, exc)
            answer = status(runtime)
        return _answer(answer)


def _answer(answer: Mapping[str, object]) -> web.Response:
    return web.json_response(answer, headers={"Cache-Control": "no-store"}, dumps=dumps)
