"""The dashboard's actions: ``POST /targets/<name>/wake|release|park``.

Allowed only with ``admin.token_file`` configured and its token given as ``Authorization: Bearer
<token>`` (compared in constant time): without a token file they answer 403, with a missing or
wrong token 401. Answers are JSON, errors in warmgate's shape ``{"error": {"code", "message",
"target"}}``.

- **wake**: the start a held request makes, without holding one (a cold target starts; a failed
  one after its backoff).
- **release**: the release of idleness, now, whatever ``idle_after``: the ask reaches the
  target's lifecycle as an input, which decides as always (it asks the engine once more whether
  it is busy, and stops; with several replicas, the leader once every replica is idle). Its
  reason is ``released by an operator``; the idle time shown stays the real one, and the gap it
  ends teaches ``idle_after: auto`` nothing. Never work in flight: a target with requests held
  or in flight, a stream with traffic or a busy engine is not released (409).
- **park**: the same park as idleness, now: a ready target whose engine can be parked is parked
  once its lifecycle looks (the engine drops its weights, its process stays; docs/pools.md).
  Never work in flight (409, as for release); 409 "parking is not available for this target"
  for an engine with no park action.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web

from backends.base import parking
from router.config import Config
from router.dashboard.events import EventBus
from router.errors import ConfigError
from router.scale.state import Phase
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.dashboard")

ACTIONS = ("wake", "release", "park")


def read_token(config: Config) -> str | None:
    """The admin token from ``admin.token_file`` (relative to the config file), or ``None``."""
    name = config.admin.token_file
    if name is None:
        return None
    path = Path(config.base_dir, name)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(config.source, [("admin.token_file", f"{path}: {exc.strerror}")]) from exc
    if not token or len(token.split()) != 1:
        problem = f"{path}: expected one token (no spaces) on one line"
        raise ConfigError(config.source, [("admin.token_file", problem)])
    return token


def asked_from(request: web.Request) -> str:
    """Where an action came from, in words: the dashboard's buttons (a script of a page of this
    same listener: the browser says ``Sec-Fetch-Site: same-origin``, which no page of another
    site can make it say) or the admin API (curl, a script with the token)."""
    if request.headers.get("Sec-Fetch-Site") == "same-origin":
        return "from the dashboard"
    return "through the admin API"


def _error(status: int, code: str, message: str, target: str | None = None) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="warmgate admin"'} if status == 401 else None
    body = {"error": {"code": code, "message": message, "target": target}}
    return web.json_response(body, status=status, headers=headers)


def _busy(runtime: TargetRuntime) -> str | None:
    """What keeps the target at work now (a release would cut it), or ``None``."""
    activity, now = runtime.activity, runtime.loop.time()
    window = runtime.spec.scaling.stream_activity_window
    if activity.held:
        return f"{activity.held} requests are held for it"
    if activity.in_flight:
        return f"{activity.in_flight} requests are in flight"
    if activity.last_frame + window > now:
        return "a stream carried traffic within stream_activity_window"
    if activity.busy_until > now:
        return "its engine reports work in its queue"
    return None


class Actions:
    def __init__(
        self, token: str | None, runtimes: Mapping[str, TargetRuntime], bus: EventBus
    ) -> None:
        self.token = token
        self.runtimes = runtimes
        self.bus = bus

    @property
    def allowed(self) -> bool:
        return self.token is not None

    def _refused(self, request: web.Request) -> web.Response | None:
        if self.token is None:
            message = "actions are off: warmgate's config has no admin.token_file (read-only)"
            return _error(403, "actions_off", message)
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return _error(401, "unauthorized", "the admin token is needed (Authorization: Bearer)")
        if not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            return _error(401, "unauthorized", "the admin token is wrong")
        return None

    async def handle(self, request: web.Request) -> web.Response:
        name, action = request.match_info["name"], request.match_info["action"]
        refused = self._refused(request)
        if refused is not None:
            return refused
        runtime = self.runtimes.get(name)
        if runtime is None:
            return _error(404, "unknown_target", f"no target named {name!r}", name)
        if action == "park" and parking(runtime.engine) is None:
            return _error(409, "not_available", "parking is not available for this target", name)
        if runtime.backend.always_on:
            return _error(409, "always_on", f"{name} is always on: nothing to {action}", name)
        if not runtime.supervisor.running:  # an ask would be an input nobody reads
            message = f"{name}'s lifecycle is not running: nothing would carry out the {action}"
            return _error(503, "lifecycle_stopped", message, name)
        if action == "park":
            result = self.park(runtime)
        else:
            result = self.wake(runtime) if action == "wake" else self.release(runtime)
        if isinstance(result, web.Response):
            return result
        status, text = result
        origin = asked_from(request)
        log.info("%s: %s asked %s (%s)", name, action, origin, text)
        if status == 202:
            self.bus.add(name, f"{action} asked", f"{origin}: {text}")
        phase = runtime.state.phase.value
        return web.json_response(
            {"target": name, "action": action, "result": text, "phase": phase}, status=status
        )

    def wake(self, runtime: TargetRuntime) -> tuple[int, str] | web.Response:
        state = runtime.state
        if state.phase is Phase.READY:
            return 200, "already ready"
        if state.phase is Phase.STARTING or state.waking:
            return 200, "already starting" if state.phase is Phase.STARTING else "already waking"
        runtime.request_start()
        if state.phase is Phase.PARKED:
            return 202, "waking"
        wait = state.retry_at - runtime.loop.time()
        if state.phase is Phase.FAILED and wait > 0:
            return 202, f"starts after its backoff, in {math.ceil(wait)}s"
        if state.phase is Phase.DRAINING:
            return 202, "starts again once the release is done"
        return 202, "starting"

    def park(self, runtime: TargetRuntime) -> tuple[int, str] | web.Response:
        state, name = runtime.state, runtime.name
        if state.phase is Phase.PARKED:
            return 200, "waking" if state.waking else "already parked"
        if state.phase is not Phase.READY:
            message = f"{name} is {state.phase.value}: only a ready target is parked"
            return _error(409, "not_ready", message, name)
        busy = _busy(runtime)
        if busy is not None:
            message = (
                f"not parked: {busy}; a park never cuts work in flight "
                "(it is parked once idle for park_after)"
            )
            return _error(409, "busy", message, name)
        runtime.ask_park()
        return 202, "parks now: its engine drops its weights, its process stays"

    def release(self, runtime: TargetRuntime) -> tuple[int, str] | web.Response:
        state, name = runtime.state, runtime.name
        if state.phase is Phase.DRAINING:
            return 200, "already releasing"
        if state.phase is Phase.PARKED and not (state.parking or state.waking):
            busy = _busy(runtime)
            if busy is not None:
                return _error(409, "busy", f"not released: {busy}", name)
            runtime.ask_release()
            return 202, "released as idle: it stops now"
        if state.phase is not Phase.READY:
            message = f"{name} is {state.phase.value}: only a ready target is released"
            return _error(409, "not_ready", message, name)
        busy = _busy(runtime)
        if busy is not None:
            message = (
                f"not released: {busy}; a release never cuts work in flight "
                "(it is released once idle for idle_after)"
            )
            return _error(409, "busy", message, name)
        runtime.ask_release()
        return 202, "released as idle: it drains and stops now"
