"""Websockets held for a target that is not ready (``waiting.hold_websockets``; comfyui by
default): an open tab stays calm while its GPU is released.

A render UI's tab keeps one websocket open for status and progress; refused (503) while its
target is cold, ComfyUI's frontend retries it forever and shows a red "Reconnecting" banner until
reloaded. Here the upgrade is accepted at once and the socket held open silently: it never wakes
the target (it is no activity while held, and counts only in ``max_held``). When a real request
(``POST /prompt``) wakes the target, the engine's websocket is connected with the same path and
query as soon as the engine listens, and the two are bridged; what the tab sent meanwhile goes
first. Connected again, it asks for the name the engine gave the tab (ComfyUI's ``clientId``,
from its first ``status`` frame where the tab sent none: the engine's messages for that tab reach
it). A release or a park does not close the tab's socket either: only the engine's side is
closed, and the tab's is held again until the next start. warmgate's shutdown closes it with
1001.

The pipe, its close codes and its accounting are the one bridge every websocket has
(:class:`router.http.bridge.Bridge`); here is the holding: when, and to which engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final, Literal

import aiohttp
from aiohttp import WSCloseCode, web
from multidict import CIMultiDict
from yarl import URL

from backends.base import websocket_again
from router.errors import Shedding
from router.http.bridge import Bridge, Ended, Ends
from router.http.websocket import close_for, connect_upstream
from router.scale.activity import StreamEnd
from router.scale.hold import shutting_down
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.proxy")

RETRY_AFTER: Final = 2.0
"""Seconds before the engine's websocket is tried again after it could not be reached while
the target looked ready (an engine that just died, before its lifecycle saw it); while it
starts, the readiness probe's interval, if shorter."""


def holds(runtime: TargetRuntime, request: web.Request) -> bool:
    """Whether this websocket upgrade is held rather than refused while the target is not ready:
    the target holds websockets, and the client asks for no subprotocol (which only the engine
    could choose)."""
    return runtime.spec.holds_websockets and not request.headers.get("Sec-WebSocket-Protocol")


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
        upstream_path = URL(path, encoded=True).path
        self.bridge = Bridge(request, runtime, upstream_path, ended, holds=self._held_again)

    def _held_again(self) -> bool:
        """A release holds the tab again; warmgate's shutdown closes it."""
        return not self.rt.closing

    async def serve(self) -> web.StreamResponse:
        """Answer the upgrade and keep the tab's socket until it ends. Raises
        :class:`router.errors.RequestError` for an upgrade that is not accepted."""
        rt, bridge = self.rt, self.bridge
        state = rt.servable_now()
        if state is not None:  # ready: the engine answers the upgrade, as ever
            # A tab connecting its socket is no use of the GPU: the idle clock stays.
            with rt.in_flight(counts=bridge.open_mode) as flight:
                upstream = await self._connect(rt.pick_endpoint(state))
                if isinstance(upstream, web.Response):
                    bridge.ended(upstream)
                    return upstream
                if bridge.open_mode:  # in flight until its first bridge ends (serve's block)
                    return await bridge.serve(upstream, flight, again=self._again)
            return await bridge.serve(upstream, again=self._again)  # by its frames, once up
        if rt.closing:
            raise shutting_down(rt.name)
        if rt.waiting() >= rt.spec.scaling.max_held:
            raise Shedding(
                f"target {rt.name!r} is not ready and {rt.waiting()} requests and websockets "
                "are already waiting",
                target=rt.name,
                retry_after=5.0,
            )
        return await bridge.serve(None, again=self._again)

    async def _again(self, how: Ends | None) -> aiohttp.ClientWebSocketResponse | None:
        """The engine's next socket for the tab, once the last bridge ended ``how`` (``None``:
        there was none): held until the engine is up for work; ``None`` when the tab left, the
        engine refused it, or warmgate shuts down."""
        if how is not None:
            log.debug("%s: websocket %s held again (%s)", self.rt.name, self.path, how.value)
        # Connected again under the name the engine gave the tab (ComfyUI's clientId).
        self.path = websocket_again(self.rt.engine, self.path, self.bridge.first_text)
        stale = self.rt.state if how is Ends.LOST else None  # gone before its lifecycle saw it
        while True:
            if not await self._hold(stale):
                return None
            stale = self.rt.state
            upstream = await self._connect_ready()
            if upstream == "refused":
                return None
            if upstream != "unreachable":
                return upstream
            # held again, tried after a change or RETRY_AFTER

    async def _hold(self, stale: TargetState | None = None) -> bool:
        """Hold the tab's socket until the engine is up for work (:func:`_engine`; in a state
        other than ``stale``, or after :data:`RETRY_AFTER`); False when the tab left or
        warmgate shuts down (the socket is closed with 1001 then)."""
        rt, gone = self.rt, self.bridge.gone
        with rt.holding_socket():
            while True:
                ready = asyncio.ensure_future(rt.cell.wait_for(self._settled(stale)))
                left = asyncio.ensure_future(gone.wait())
                retry = None if stale is None else _retry(self.rt, stale)
                try:
                    await asyncio.wait(
                        (ready, left), timeout=retry, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    for task in (ready, left):
                        task.cancel()
                if gone.is_set():
                    return False
                if rt.closing:
                    await self.bridge.close_client(*close_for(StreamEnd.SHUTDOWN))
                    return False
                if _engine(rt, rt.state):
                    return True
                stale = None  # tried again after RETRY_AFTER, and not up: wait until it is

    def _settled(self, stale: TargetState | None) -> Callable[[TargetState], bool]:
        """What ends a hold: the engine up for work in a state other than ``stale``, or the
        drain."""
        rt = self.rt
        return lambda state: (state is not stale and bool(_engine(rt, state))) or rt.closing

    async def _connect(self, endpoint: str) -> aiohttp.ClientWebSocketResponse | web.Response:
        url = URL(endpoint + self.path, encoded=True)
        return await connect_upstream(self.request, self.rt, self.session, url, self.headers)

    async def _connect_ready(
        self,
    ) -> aiohttp.ClientWebSocketResponse | Literal["refused", "unreachable"]:
        """The engine's socket once it is up (:func:`_engine`), not counted in flight (the
        bridge is); ``unreachable`` when it could not be reached (held again); ``refused`` when
        it refused the websocket (the tab's is closed with 1011 and why: retrying would not
        change its mind)."""
        state = self.rt.state
        endpoints = _engine(self.rt, state)
        if not endpoints:
            return "unreachable"
        endpoint = self.rt.pick_endpoint(state) if state.endpoints else endpoints[0]
        try:
            upstream = await self._connect(endpoint)
        except Exception as exc:  # RequestError from the upgrade, or the endpoint gone
            log.debug("%s: websocket %s held: %s", self.rt.name, self.path, exc)
            return "unreachable"
        if not isinstance(upstream, web.Response):
            return upstream
        why = f"the engine refused the websocket ({upstream.status})"
        log.warning("%s: websocket %s: %s", self.rt.name, self.path, why)
        await self.bridge.close_client(WSCloseCode.INTERNAL_ERROR, why)
        return "refused"


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
