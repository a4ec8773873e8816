"""The waiting page: what a person sees while their target cold-starts.

A browser page load to a cold target gets this page at once (503, Retry-After, no-store) instead
of a spinner that times out. It names the target, shows elapsed time, an ETA learned from the
target's past cold starts (or, for a parked target, its past wakes: "Waking" rather than
"Starting") and a progress bar, says what a start waits for in a full GPU pool ("waiting for the
GPU: wan2gp is rendering"), follows the phase through ``/.warmgate/status/<target>`` and reloads
itself when the target is ready. With JavaScript off, a meta refresh does the same. API clients
are held, never shown this page.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping

from aiohttp import web

from backends.base import RequestFacts
from router.scale.state import Phase
from router.scale.targets import TargetRuntime

PREFIX = "/.warmgate/"
DEFAULT_ETA = 60.0
"""Seconds to show as the ETA before a target has ever cold-started."""


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
    waking = phase is Phase.PARKED
    moving = phase is Phase.STARTING or state.waking
    elapsed = now - state.since if moving else 0.0
    eta = runtime.wakes.predicted() if waking else runtime.predicted_cold_start(DEFAULT_ETA)
    return {
        "target": runtime.name,
        "phase": phase.value,
        "ready": phase is Phase.READY,
        "waking": waking,
        "waiting_for": _waiting_for(runtime) or None,
        "elapsed": round(elapsed, 2),
        "eta": round(eta, 2),
        "retry_in": round(max(0.0, state.retry_at - now), 1) if phase is Phase.FAILED else None,
        "held": runtime.activity.held,
    }


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<noscript><meta http-equiv="refresh" content="{refresh}"></noscript>
<title>{verb} {name}…</title>
<style>
body{{font:16px/1.5 system-ui,sans-serif;background:#111;color:#eee;display:grid;
place-items:center;min-height:100vh;margin:0}}
main{{width:min(32rem,90vw)}}h1{{font-size:1.3rem;margin:0 0 .5rem}}
.bar{{height:.6rem;background:#333;border-radius:.3rem;overflow:hidden;margin:1rem 0}}
.fill{{height:100%;width:{percent}%;background:#4c8;transition:width .4s}}
small{{color:#999}}
</style></head>
<body><main>
<h1 id="title">{verb} <b>{name}</b></h1>
<p id="phase">{text}</p>
<p id="pool"{pool_hidden}>{waiting_for}</p>
<div class="bar"><div class="fill" id="fill"></div></div>
<p><span id="elapsed">{elapsed}</span> s elapsed · about <span id="eta">{eta}</span> s expected</p>
<small>warmgate · <span id="state">{phase}</span></small>
</main>
<script>
(function () {{
  var status = {status_json};
  var shownAt = Date.now() - status.elapsed * 1000;
  var url = "/.warmgate/status/" + encodeURIComponent(status.target);
  function show(s) {{
    var elapsed = (Date.now() - shownAt) / 1000;
    document.getElementById("elapsed").textContent = elapsed.toFixed(0);
    document.getElementById("eta").textContent = Math.round(s.eta);
    document.getElementById("state").textContent = s.phase;
    var pool = document.getElementById("pool");
    pool.hidden = !s.waiting_for;
    pool.textContent = s.waiting_for ? s.waiting_for.charAt(0).toUpperCase() +
      s.waiting_for.slice(1) + "." : "";
    document.getElementById("title").firstChild.nodeValue = s.waking ? "Waking " : "Starting ";
    var pct = Math.min(95, 100 * elapsed / Math.max(1, s.eta));
    document.getElementById("fill").style.width = pct.toFixed(1) + "%";
    if (s.phase === "failed") {{
      document.getElementById("phase").textContent =
        "The workload failed to start; warmgate tries again" +
        (s.retry_in ? " in " + Math.ceil(s.retry_in) + " s." : ".");
    }}
  }}
  function poll() {{
    fetch(url, {{cache: "no-store"}}).then(function (r) {{ return r.json(); }})
      .then(function (s) {{
        status = s; show(s);
        if (s.ready) {{ location.reload(); }} else {{ setTimeout(poll, 500); }}
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


def render(runtime: TargetRuntime) -> web.Response:
    info = status(runtime)
    eta = float(info["eta"])  # type: ignore[arg-type]
    elapsed = float(info["elapsed"])  # type: ignore[arg-type]
    waiting_for = str(info["waiting_for"] or "")
    body = _PAGE.format(
        verb="Waking" if info["waking"] else "Starting",
        text=_WAKING if info["waking"] else _STARTING,
        waiting_for=html.escape(
            waiting_for[:1].upper() + waiting_for[1:] + "." if waiting_for else ""
        ),
        pool_hidden="" if waiting_for else " hidden",
        name=html.escape(runtime.name),
        refresh=3,
        percent=f"{min(95.0, 100 * elapsed / max(1.0, eta)):.1f}",
        elapsed=f"{elapsed:.0f}",
        eta=f"{eta:.0f}",
        phase=html.escape(str(info["phase"])),
        status_json=json.dumps(info).replace("<", "\\u003c"),
    )
    retry = max(1, math.ceil(min(eta - elapsed, 10.0))) if eta > elapsed else 2
    return web.Response(
        status=503,
        text=body,
        content_type="text/html",
        headers={"Retry-After": str(retry), "Cache-Control": "no-store"},
    )


class WaitingPages:
    """The dispatcher's hook: a page for browsers that load a page from a cold target."""

    def __init__(self, runtimes: Mapping[str, TargetRuntime]) -> None:
        self.runtimes = runtimes

    def __call__(
        self, request: web.Request, runtime: TargetRuntime, facts: RequestFacts
    ) -> web.StreamResponse | None:
        if runtime.spec.waiting_page != "auto" or not facts.is_navigation or facts.is_websocket:
            return None
        if runtime.may_wake(facts):
            runtime.request_start()
        return render(runtime)

    async def handle(self, request: web.Request) -> web.Response:
        """``/.warmgate/status/<target>``: the phase, for the page's polling. Never forwarded."""
        name = request.match_info.get("target", "")
        runtime = self.runtimes.get(name)
        if request.match_info.get("kind") != "status" or runtime is None:
            raise web.HTTPNotFound(text="unknown warmgate page")
        return web.json_response(status(runtime), headers={"Cache-Control": "no-store"})
