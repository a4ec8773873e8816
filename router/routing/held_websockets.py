"""Websockets held for a target that is not ready (``waiting.hold_websockets``; comfyui by
default): an open tab stays calm while its GPU is released.

A render UI's tab keeps one websocket open for status and progress; refused (503) while its
target is cold, ComfyUI's frontend retries it forever and shows a red "Reconnecting" banner until
reloaded. Here the upgrade is accepted at once and the socket held open silently: it never wakes
the target (it is no activity while held, and counts only in ``max_held``). When a real request
(``POST /prompt``) wakes the target, the engine's websocket is connected with the same path and
query (ComfyUI's ``clientId``: the engine's messages for that tab reach it) as soon as the engine
listens, and the two are bridged; what the tab sent meanwhile goes first. A release or a park
does not close the tab's socket either: only the engine's side is closed, and the tab's is held
again until the next start. warmgate's shutdown closes it with 1001.

The tab's side, read for its whole life, is :class:`router.routing.tab.Tab`; here is the
holding, and one pump from the engine's socket per bridge."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from enum import Enum
from typing import Final, Literal

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from multidict import CIMultiDict
from yarl import URL

from router.errors import Shedding, UpstreamError
from router.http.websocket import NO_CODE, close_reason, connect_upstream
from router.routing.tab import GOING_AWAY, Tab
from router.scale.hold import shutting_down
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.proxy")

RETRY_AFTER: Final = 2.0
"""Seconds before the engine's websocket is tried again after it could not be reached while
the target looked ready (an engine that just died, before its lifecycle saw it); while it
starts, the readiness probe's interval, if shorter."""

Ended = Callable[[web.StreamResponse], object]


def holds(runtime: TargetRuntime, request: web.Request) -> bool:
    """Whether this websocket upgrade is held rather than refused while the target is not ready:
    the target holds websockets, and the client asks for no subprotocol (which only the engine
    could choose)."""
    return runtime.spec.holds_websockets and not request.headers.get("Sec-WebSocket-Protocol")


class Bridge(Enum):
    """How one bridge to the engine ended."""

    RELEASED = "released"
    """warmgate closed the engine's side (a release): the tab's socket is held again."""
    LOST = "lost"
    """The engine's connection ended without a close frame (it went away): held again."""
    CLOSED = "closed"
    """The engine closed its websocket: the tab's is closed the same way."""
    GONE = "gone"
    """The tab left."""


class HeldWebsocket:
    """One tab's websocket to a target that holds them, from its upgrade to its end."""

    def __init__(
        self,
        request: web.Request,
        runtime: TargetRuntime,
        session: aiohttp.ClientSession,
        path: str,
        headers: CIMultiDict[str],
        ended: Ended,
    ) -> None:
        """``path``: the upstream path with the client's query; ``ended``: told the response
        once, however it ends (it accounts the request)."""
        self.request = request
        self.rt = runtime
        self.session = session
        self.path = path
        self.headers = headers
        self.ended = ended
        mode = runtime.engine.stream_activity(URL(path, encoded=True).path)
        self.open_mode = mode == "open"
        """Bridged, it is in flight for its whole life (else by its frames, or not at all)."""
        self.counts = mode in ("frames", "jobs")
        limit = runtime.spec.limits.max_ws_message
        self.tab = Tab(runtime.activity, runtime.loop, limit, self.counts)
        self.upstream: aiohttp.ClientWebSocketResponse | None = None
        self.released = False
        """The engine's side is being closed by a release (not by the tab, not by the engine)."""

    # -- the whole life ----------------------------------------------------------------------

    async def serve(self) -> web.StreamResponse:
        """Answer the upgrade and keep the tab's socket until it ends. Raises
        :class:`router.errors.RequestError` for an upgrade that is not accepted."""
        rt, tab = self.rt, self.tab
        state = rt.servable_now()
        if state is not None:  # ready: the engine answers the upgrade, as ever
            upstream = await self._connect(rt.pick_endpoint(state))
            if isinstance(upstream, web.Response):
                self.ended(upstream)
                return upstream
            self.upstream = upstream
        elif rt.closed():
            raise shutting_down(rt.name)
        elif rt.waiting() >= rt.spec.scaling.max_held:
            raise Shedding(
                f"target {rt.name!r} is not ready and {rt.waiting()} requests and websockets "
                "are already waiting",
                target=rt.name,
                retry_after=5.0,
            )
        try:
            await tab.socket.prepare(self.request)
        except (ConnectionResetError, aiohttp.ClientError) as exc:
            if self.upstream is not None:
                await self.upstream.close()
            raise UpstreamError("client left during the upgrade", target=rt.name) from exc
        reader = asyncio.ensure_future(tab.read())
        try:
            await self._run()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self.ended(tab.socket)
            code, reason = tab.close_with
            if self.upstream is not None and not self.upstream.closed:
                with contextlib.suppress(Exception):
                    await self.upstream.close(code=code, message=close_reason(reason))
            await tab.close(code, reason)
        return tab.socket

    async def _run(self) -> None:
        stale: TargetState | None = None
        while True:
            if self.upstream is None:
                if not await self._hold(stale):
                    return
                stale = self.rt.state
                upstream = await self._connect_ready()
                if upstream == "refused":
                    return
                if upstream == "unreachable":
                    continue  # held again, tried after a change or RETRY_AFTER
                self.upstream, stale = upstream, None
            how = await self._bridge(self.upstream)
            self.upstream = None
            if how in (Bridge.CLOSED, Bridge.GONE):
                return
            if how is Bridge.LOST:
                stale = self.rt.state  # the engine may be gone before its lifecycle saw it
            log.debug("%s: websocket %s held again (%s)", self.rt.name, self.path, how.value)

    # -- held ---------------------------------------------------------------------------------

    async def _hold(self, stale: TargetState | None = None) -> bool:
        """Hold the tab's socket until the engine is up for work (:func:`_engine`; in a state
        other than ``stale``, or after :data:`RETRY_AFTER`); False when the tab left or
        warmgate shuts down (the socket is closed with 1001 then)."""
        rt = self.rt
        rt.activity.held_sockets += 1
        gauge = rt.metrics.websockets_held.labels(rt.name)
        gauge.inc()
        try:
            while True:
                ready = asyncio.ensure_future(rt.cell.wait_for(self._settled(stale)))
                gone = asyncio.ensure_future(self.tab.gone.wait())
                retry = None if stale is None else _retry(self.rt, stale)
                try:
                    await asyncio.wait(
                        (ready, gone), timeout=retry, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    for task in (ready, gone):
                        task.cancel()
                if self.tab.gone.is_set():
                    return False
                if rt.closed():
                    await self.tab.close(GOING_AWAY, "warmgate is shutting down")
                    return False
                if _engine(rt, rt.state):
                    return True
                stale = None  # tried again after RETRY_AFTER, and not up: wait until it is
        finally:
            rt.activity.held_sockets -= 1
            gauge.dec()

    def _settled(self, stale: TargetState | None) -> Callable[[TargetState], bool]:
        """What ends a hold: the engine up for work in a state other than ``stale``, or the
        drain."""
        rt = self.rt
        return lambda state: (state is not stale and bool(_engine(rt, state))) or rt.closed()

    async def _connect(
        self, endpoint: str, counted: bool = True
    ) -> aiohttp.ClientWebSocketResponse | web.Response:
        """The engine's websocket at ``endpoint``; ``counted``: in flight while the engine
        answers the upgrade, as any websocket when the tab asks a ready target (activity only
        where the engine counts its sockets ``open``); a held one is not counted at all."""
        rt = self.rt
        url = URL(endpoint + self.path, encoded=True)
        if not counted:
            return await connect_upstream(self.request, rt, self.session, url, self.headers)
        # A tab reconnecting its socket is no use of the GPU: the idle clock stays.
        with rt.in_flight(counts=self.open_mode):
            return await connect_upstream(self.request, rt, self.session, url, self.headers)

    async def _connect_ready(
        self,
    ) -> aiohttp.ClientWebSocketResponse | Literal["refused", "unreachable"]:
        """The engine's socket once it is up (:func:`_engine`); ``unreachable`` when it could
        not be reached (held again); ``refused`` when it refused the websocket (the tab's is
        closed with 1011 and why: retrying would not change its mind)."""
        state = self.rt.state
        endpoints = _engine(self.rt, state)
        if not endpoints:
            return "unreachable"
        endpoint = self.rt.pick_endpoint(state) if state.endpoints else endpoints[0]
        try:
            upstream = await self._connect(endpoint, counted=False)
        except Exception as exc:  # RequestError from the upgrade, or the endpoint gone
            log.debug("%s: websocket %s held: %s", self.rt.name, self.path, exc)
            return "unreachable"
        if not isinstance(upstream, web.Response):
            return upstream
        why = f"the engine refused the websocket ({upstream.status})"
        log.warning("%s: websocket %s: %s", self.rt.name, self.path, why)
        self.tab.close_with = (WSCloseCode.INTERNAL_ERROR, why)
        await self.tab.close(WSCloseCode.INTERNAL_ERROR, why)
        return "refused"

    # -- bridged ------------------------------------------------------------------------------

    async def _bridge(self, upstream: aiohttp.ClientWebSocketResponse) -> Bridge:
        rt, tab = self.rt, self.tab
        await tab.bridge(upstream)
        key = object()
        rt.activity.streams[key] = self.release
        rt.m_ws_open.inc()
        pump = asyncio.ensure_future(self._pump(upstream))
        gone = asyncio.ensure_future(tab.gone.wait())
        try:
            with rt.in_flight() if self.open_mode else contextlib.nullcontext():
                await asyncio.wait((pump, gone), return_when=asyncio.FIRST_COMPLETED)
                if pump.done():
                    return pump.result()
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump
                code, reason = tab.close_with
                await upstream.close(code=code, message=close_reason(reason))
                return Bridge.GONE
        finally:
            tab.engine = None
            gone.cancel()
            rt.activity.streams.pop(key, None)
            rt.m_ws_open.dec()

    async def _pump(self, upstream: aiohttp.ClientWebSocketResponse) -> Bridge:
        """The engine's messages to the tab until the engine's side ends; how it ended."""
        activity, loop = self.rt.activity, self.rt.loop
        while True:
            msg = await upstream.receive()
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                if not await self.tab.tell(msg.type, msg.data):
                    await self.tab.gone.wait()
                    return Bridge.GONE
                if self.counts:
                    activity.last_frame = loop.time()
                continue
            if self.released:
                return Bridge.RELEASED
            if msg.type is not WSMsgType.CLOSE:  # CLOSING, CLOSED, ERROR: no close frame
                return Bridge.LOST
            code = msg.data if isinstance(msg.data, int) and msg.data != NO_CODE else 1000
            reason = msg.extra or ""
            await upstream.close(code=code, message=close_reason(reason))
            self.tab.close_with = (code, reason)
            await self.tab.close(code, reason)
            return Bridge.CLOSED

    async def release(self, code: int, reason: str) -> None:
        """The target is released (or warmgate shuts down): at a release only the engine's
        side is closed, and the tab's is held again; at shutdown both, with ``code``."""
        upstream = self.upstream
        if self.rt.closed():
            self.tab.close_with = (code, reason)
            await self.tab.close(code, reason)
            if upstream is not None:
                await upstream.close(code=code, message=close_reason(reason))
            return
        if upstream is not None and not upstream.closed:
            self.released = True
            self.tab.engine = None  # what the tab says from now on waits for the next bridge
            try:
                await upstream.close(code=code, message=close_reason(reason))
            finally:
                self.released = False


def _engine(runtime: TargetRuntime, state: TargetState) -> tuple[str, ...]:
    """The engine's endpoints to bridge a held tab to: the target ready, or starting or
    waking (for work someone else asked for) with its engine already listening, so the tab
    is bridged before the request that woke it is forwarded and sees that render's first
    messages. Empty while draining, cold or merely parked: a held tab wakes nothing."""
    if state.phase is Phase.READY:
        return state.endpoints
    if state.phase is Phase.STARTING or (state.phase is Phase.PARKED and state.waking):
        return runtime.backend.observe().endpoints
    return ()


def _retry(runtime: TargetRuntime, stale: TargetState) -> float:
    """Seconds before the engine is tried again: while it starts or wakes, at the pace of
    its readiness probe (it listens before it is ready: the tab is bridged before the work
    that woke it is forwarded); else :data:`RETRY_AFTER`."""
    if stale.phase is Phase.READY:
        return RETRY_AFTER
    return min(RETRY_AFTER, runtime.spec.readiness.interval)
