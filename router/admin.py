"""The admin listener: /healthz, /readyz, /metrics and /targets. Never served publicly, and
answering only to the names it is reached by (``admin.allowed_hosts``): 421 to any other Host."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from router.http.finite_json import dumps
from router.keys import CONFIG, METRICS, READINESS, RUNTIMES
from router.routing.match import normalize_host, under
from router.scale.state import Phase
from router.scale.targets import TargetRuntime


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    ready = request.app[READINESS]
    problems = ready.problems()
    status = "ready" if not problems else ("degraded" if ready.listening else "not ready")
    code = 200 if ready.listening else 503
    return web.json_response({"status": status, "problems": problems}, status=code)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def targets(request: web.Request) -> web.Response:
    now = asyncio.get_running_loop().time()
    out = {}
    for name, runtime in request.app[RUNTIMES].items():
        state = runtime.state
        activity = runtime.activity
        idle_since = activity.idle_since(runtime.spec.scaling.stream_activity_window)
        if state.phase is Phase.COLD or state.phase is Phase.STARTING:
            idle_since = None  # nothing running yet to be idle: the clock starts once ready
        out[name] = {
            "phase": state.phase.value,
            "for_seconds": round(now - state.since, 3),
            "reason": state.reason,
            # the stage of a start (docs/operations.md), its time so far, the ETA left
            **_start(runtime, now),
            "endpoints": list(state.endpoints),
            "in_flight": activity.in_flight,
            "held": activity.held,
            "streams": len(activity.streams),
            "held_websockets": activity.held_sockets,
            "idle_seconds": None if idle_since is None else round(max(0.0, now - idle_since), 3),
            # idle_after in force (learned for auto), what it was learned from, keep_warm
            **runtime.learned.describe_idle(),
            # the parked tier and the GPU pool (docs/pools.md)
            "parking": state.parking,
            "waking": state.waking,
            "waiting_for": state.waiting_for or None,
            "pool": runtime.pool.name if runtime.pool is not None else None,
            # the engine's own queue as the busy poll read it (docs/engines.md)
            **_queue(runtime),
        }
    return web.json_response(out, dumps=dumps)


def _queue(runtime: TargetRuntime) -> dict[str, Any]:
    ready = runtime.servable_now() is not None
    seconds = runtime.queue.job_seconds
    return {
        "queue_depth": runtime.queue.depth if ready else None,
        "job_seconds": None if seconds is None else round(seconds, 3),
    }


def _start(runtime: TargetRuntime, now: float) -> dict[str, Any]:
    state = runtime.state
    starting = state.phase is Phase.STARTING
    stage = state.stage if starting else None
    remaining = runtime.learned.eta(runtime.state)
    return {
        "stage": stage,
        "stage_message": state.stage_message or None if stage is not None else None,
        "stage_seconds": round(now - state.stage_since, 3) if stage is not None else None,
        "progress": state.progress if starting else None,
        "eta_seconds": None if remaining is None else round(remaining, 2),
        "cold_start": runtime.learned.cold_starts.describe(),
    }


def host_allowed(host: str | None, local: str | None, allowed: tuple[str, ...]) -> bool:
    """A request with ``Host: host``, come in on the address ``local``, may be answered:
    loopback names and addresses, ``local`` itself, and the names in ``allowed`` (exact or
    ``*.suffix``). No Host at all (HTTP/1.0) is no browser's: allowed."""
    if host is None:
        return True
    bare = normalize_host(host)
    if bare == "localhost" or bare.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        address = None
    if address is not None:
        return address.is_loopback or (local is not None and bare == normalize_host(local))
    return any(under(bare, name[1:]) if name.startswith("*.") else bare == name for name in allowed)


@web.middleware
async def known_host(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """421 to a Host the admin listener is not reached by (DNS rebinding from a web page)."""
    config = request.app.get(CONFIG)
    allowed = config.admin.allowed_hosts if config is not None else ()
    transport = request.transport
    name = transport.get_extra_info("sockname") if transport is not None else None
    local = name[0] if isinstance(name, tuple) else None
    if not host_allowed(request.headers.get("Host"), local, allowed):
        return web.json_response(
            {
                "error": {
                    "code": "misdirected",
                    "message": "this admin listener does not answer to that Host: "
                    "see admin.allowed_hosts",
                }
            },
            status=421,
        )
    return await handler(request)


def build_admin_app() -> web.Application:
    app = web.Application(middlewares=[known_host])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/targets", targets)
    return app
