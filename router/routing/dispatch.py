"""The public request path: match a route, get a ready endpoint (holding through a cold start),
forward, account. Errors from any step become one reply (router.http.replies)."""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

import aiohttp
from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from backends.base import RequestFacts, json_answer
from router.config import logged_path
from router.errors import BadRequest, BodyTooLarge, NoRoute, RequestError, UpstreamError
from router.http.bridge import forward_websocket
from router.http.h1.pool import Endpoint, endpoint
from router.http.headers import WEBSOCKET_HANDSHAKE, upstream_request_head, upstream_request_headers
from router.http.proxy import respond
from router.http.replies import STARTED, error_response, request_key
from router.http.upstream import UpstreamRequest
from router.http.websocket import handshake_refusal, is_websocket_upgrade
from router.metrics import Metrics
from router.routing.held_websockets import HeldWebsocket, holds
from router.routing.match import Match, RouteTable
from router.routing.padded import PaddedHold, may_pad
from router.routing.paths import normalize_path
from router.scale.hold import HoldResult
from router.scale.state import Phase, TargetState
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.access")

_COUNTERS_MAX = 4096
"""Cached request counters (target, method, status); methods come from clients, so bounded."""


def is_navigation(request: web.BaseRequest) -> bool:
    """A browser loading a page (not XHR/fetch, not an asset)."""
    if request.method != "GET" or "text/html" not in request.headers.get("Accept", ""):
        return False
    mode = request.headers.get("Sec-Fetch-Mode")
    if mode is not None:
        return mode == "navigate"
    return request.headers.get("X-Requested-With") is None


_ASSET_DESTS = frozenset(
    {"image", "style", "script", "font", "manifest", "audio", "video", "track"}
)
"""``Sec-Fetch-Dest`` of a page's sub-resources (what a page pulls in, not what it asks)."""


def is_asset(request: web.BaseRequest) -> bool:
    """A page's sub-resource (an icon, a stylesheet, a script, a font): held through a start, it
    goes on at ready without a turn (``waiting.release_rate`` paces pages and calls; twelve tabs'
    favicons went first, at 2 a second). Without ``Sec-Fetch-Dest``: a favicon by its path."""
    if request.method not in ("GET", "HEAD"):
        return False
    dest = request.headers.get("Sec-Fetch-Dest")
    if dest is not None:
        return dest in _ASSET_DESTS
    return request.path.rpartition("/")[2] == "favicon.ico"


class Dispatcher:
    def __init__(
        self,
        table: RouteTable,
        runtimes: Mapping[str, TargetRuntime],
        sessions: Mapping[str, aiohttp.ClientSession],
        metrics: Metrics,
        *,
        trust_forwarded: bool,
        access_log: bool,
        log_query: bool = False,
    ) -> None:
        self.table = table
        self.runtimes = runtimes
        self.sessions = sessions
        self.metrics = metrics
        self.trust_forwarded = trust_forwarded
        self.access_log = access_log
        self.log_query = log_query
        """The access log writes the query string too (``server.log_query``)."""
        self.waiting_page: WaitingPageHook | None = None
        self.loop = asyncio.get_running_loop()
        self._counters: dict[tuple[str, str, int], Any] = {}

    def _count(self, target: str, method: str, status: int) -> None:
        key = (target, method, status)
        counter = self._counters.get(key)
        if counter is None:
            counter = self.metrics.requests.labels(target, method, str(status))
            if len(self._counters) >= _COUNTERS_MAX:
                self._counters.clear()
            self._counters[key] = counter
        counter.inc()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        # A request waiting on its upstream keeps this frame, and thousands may wait at once:
        # the work around the awaits is in helpers, so few locals and values stay here.
        started = self.loop.time()
        runtime: TargetRuntime | None = None
        response: web.StreamResponse | None = None
        padded: PaddedHold | None = None
        try:
            runtime, match = self._route(request)
            if match.redirect is not None:
                query = request.raw_path.partition("?")[2]
                location = match.redirect + ("?" + query if query else "")
                response = web.Response(status=308, headers={"Location": location})
                return response
            websocket = is_websocket_upgrade(request)
            refusal = handshake_refusal(request) if websocket else None
            if refusal is not None:  # before anything is woken or opened upstream for it
                response = refusal
                return response
            if websocket and holds(runtime, request):  # accepted even while not ready
                response = await self._held_websocket(request, runtime, match, started)
                return response
            state = runtime.servable_now()
            cold_wait: float | None = None
            if state is None:  # cold: a browser loading a page gets the waiting page, or hold
                page = self._waiting_page(request, runtime, match, websocket)
                if page is not None:
                    response = page
                    return response
                if (
                    not websocket
                    and may_pad(request)
                    and json_answer(runtime.engine, request.method, match.upstream_path)
                ):
                    padded = PaddedHold(request)  # its client may read with a short timeout
                try:
                    state, cold_wait = _ready(
                        await runtime.acquire(
                            self._facts(request, match, websocket), paced=not is_asset(request)
                        )
                    )
                except BaseException as exc:
                    if padded is not None:
                        await padded.stop()
                        if isinstance(exc, RequestError):
                            await padded.fail(exc)
                    raise
            if websocket:  # accounted when it ends, however it ends
                response = await self._websocket(request, runtime, state, match, cold_wait, started)
                return response
            ep = endpoint(runtime.pick_endpoint(state))
            # To a parked target (a read it answers without its GPU): in flight, so it is not
            # released under the read, but no activity that keeps it from its release.
            with runtime.in_flight(counts=state.phase is not Phase.PARKED) as in_flight:
                if padded is not None:
                    await padded.stop()
                    if not padded.began:
                        padded = None
                # Awaited here, then respond(), rather than forward(): while the upstream
                # thinks, this frame is the only one of ours.
                exchange = await UpstreamRequest(
                    request,
                    runtime,
                    self.sessions[runtime.name],
                    ep,
                    functools.partial(self._head, request, ep, match, identity=padded is not None),
                )
                try:
                    if padded is not None:  # its answer began: the engine's body follows it
                        response = await padded.finish(runtime, exchange)
                    else:
                        response = await respond(
                            request, runtime, exchange, match.upstream_path, cold_wait, in_flight
                        )
                finally:
                    exchange.close()
            return response
        except RequestError as exc:
            response = _error_reply(request, exc)
            return response
        finally:
            # However the request ends: answered, refused, or cut short (the handler is
            # cancelled when its client goes away, in the middle of a stream too).
            if padded is not None:
                padded.cancel()
            self._account(request, runtime, started, response)

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue``: a request its route refuses (a body over ``max_body``, no
        route) is answered now, without ``100 Continue``, and its connection closed (the body
        may follow or not); any other gets aiohttp's ``100 Continue``."""
        try:
            self._route(request)
        except RequestError as exc:
            response = error_response(request, exc)
            response.force_close()
            self._account(request, None, self.loop.time(), response)
            return response
        await _default_expect_handler(request)
        return None

    def _account(
        self,
        request: web.Request,
        runtime: TargetRuntime | None,
        started: float,
        response: web.StreamResponse | None,
    ) -> None:
        """Count and log one request, once (a websocket's end may have come first);
        ``response`` None: it ended before its handler returned (see :func:`_answered`)."""
        if ACCOUNTED in request:
            return
        request[ACCOUNTED] = True
        target = runtime.name if runtime is not None else "-"
        status = response.status if response is not None else _answered(request)
        self._count(target, request.method, status)
        if runtime is not None:
            runtime.m_request_duration.observe(self.loop.time() - started)
        if self.access_log:
            log.info(
                '%s "%s %s" %s target=%s %.3fs',
                request.remote,
                request.method,
                logged_path(request.raw_path, self.log_query),
                status,
                target,
                self.loop.time() - started,
            )

    def _route(self, request: web.Request) -> tuple[TargetRuntime, Match]:
        raw = request.raw_path
        if not raw.startswith("/"):
            raise BadRequest("the request target must be an absolute path")
        path = normalize_path(raw.partition("?")[0])
        if path is None:
            raise BadRequest("the request path hides a dot segment behind %2f or a backslash")
        headers = request.headers
        host = headers.get("Host")
        match = self.table.match(host, path, headers)
        if match is None:
            raise NoRoute(f"no route for {host or ''}{path}")
        runtime = self.runtimes[match.target]
        max_body = runtime.spec.limits.max_body
        length = request.content_length
        if length is not None and length > max_body:
            raise BodyTooLarge(
                f"request body of {length} bytes is larger than {max_body}",
                target=runtime.name,
            )
        return runtime, match

    def _facts(self, request: web.Request, match: Match, websocket: bool) -> RequestFacts:
        return RequestFacts(
            method=request.method,
            path=match.upstream_path,
            is_websocket=websocket,
            is_navigation=is_navigation(request),
        )

    def _waiting_page(
        self, request: web.Request, runtime: TargetRuntime, match: Match, websocket: bool
    ) -> web.StreamResponse | None:
        if self.waiting_page is None or websocket:
            return None
        return self.waiting_page(request, runtime, self._facts(request, match, websocket))

    def _head(
        self, request: web.Request, ep: Endpoint, match: Match, end: bytes, identity: bool = False
    ) -> bytes:
        """``identity``: the engine is asked for its body as it is (no ``Accept-Encoding``),
        to follow the whitespace of an answer that began (router/routing/padded.py)."""
        raw = request.raw_path
        mark = raw.find("?")
        query = raw[mark:] if mark >= 0 else ""
        prefix = match.entry.prefix if match.entry.strip_prefix else None
        transport = request.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        headers = request.headers
        if identity and "Accept-Encoding" in headers:
            plain = CIMultiDict(headers)
            del plain["Accept-Encoding"]
            headers = CIMultiDictProxy(plain)
        return upstream_request_head(
            f"{request.method} {ep.prefix}{match.upstream_path}{query} HTTP/1.1\r\n",
            headers,
            client_ip=peer[0] if peer else None,
            scheme=_scheme(request),
            prefix=prefix.rstrip("/") if prefix else None,
            trust_forwarded=self.trust_forwarded,
            default_host=ep.host_header,
            end=end,
        )

    async def _websocket(
        self,
        request: web.Request,
        runtime: TargetRuntime,
        state: TargetState,
        match: Match,
        cold_wait: float | None,
        started: float,
    ) -> web.StreamResponse:
        path, headers = self._websocket_upstream(request, match)
        url = URL(runtime.pick_endpoint(state) + path, encoded=True)
        session = self.sessions[runtime.name]
        ended = functools.partial(self._account, request, runtime, started)
        response = await forward_websocket(
            request, runtime, session, url, headers, cold_wait, ended
        )
        if response.status < 200 and not isinstance(response, web.WebSocketResponse):
            # The engine's 101 failed the handshake (a wrong Sec-WebSocket-Accept): no upgrade
            # happened, and a bare 101 would leave the client parsing HTTP after it.
            raise UpstreamError("the engine's websocket handshake was invalid", target=runtime.name)
        return response

    async def _held_websocket(
        self, request: web.Request, runtime: TargetRuntime, match: Match, started: float
    ) -> web.StreamResponse:
        """A websocket to a target that holds them (``waiting.hold_websockets``): bridged
        while the target is ready, held open silently while it is not."""
        path, headers = self._websocket_upstream(request, match)
        ended = functools.partial(self._account, request, runtime, started)
        held = HeldWebsocket(request, runtime, self.sessions[runtime.name], path, headers, ended)
        return await held.serve()

    def _websocket_upstream(
        self, request: web.Request, match: Match
    ) -> tuple[str, CIMultiDict[str]]:
        """The upstream path with the client's query, and the headers of the engine's
        websocket upgrade."""
        raw = request.raw_path
        mark = raw.find("?")
        query = raw[mark:] if mark >= 0 else ""
        prefix = match.entry.prefix if match.entry.strip_prefix else None
        transport = request.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        headers = upstream_request_headers(
            request.headers,
            client_ip=peer[0] if peer else None,
            scheme=_scheme(request),
            prefix=prefix.rstrip("/") if prefix else None,
            trust_forwarded=self.trust_forwarded,
            skip=WEBSOCKET_HANDSHAKE,
        )
        return match.upstream_path + query, headers


ACCOUNTED: Final = request_key("warmgate_accounted", bool)
"""Set once a request was counted and logged."""
CLIENT_CLOSED = 499
"""The status logged and counted for a request whose client left before any answer (nginx's)."""


def _answered(request: web.Request) -> int:
    """The status of a request that ended without a response from its handler: that of the
    head that went out already (a stream); else 499 when its client left (the handler was
    cancelled), 500 when it failed."""
    started: web.StreamResponse | None = request.get(STARTED)
    if started is not None:
        return started.status
    # Called from the handler's ``finally``, while what ends it propagates.
    return CLIENT_CLOSED if isinstance(sys.exc_info()[1], asyncio.CancelledError) else 500


def _error_reply(request: web.Request, error: RequestError) -> web.StreamResponse:
    """The reply for ``error``; once a response head went out, none may follow it: the
    connection is cut, and the response that began stays the answer."""
    started: web.StreamResponse | None = request.get(STARTED)
    if started is None:
        return error_response(request, error)
    if request.transport is not None:
        request.transport.close()
    return started


def _ready(held: HoldResult) -> tuple[TargetState, float | None]:
    """The state a hold ended with, and how long it waited when it was a cold start."""
    return held.state, held.waited if held.cold else None


def _scheme(request: web.Request) -> str:
    """``request.scheme`` without caching it on the request (a held request keeps its cache)."""
    transport = request.transport
    secure = transport is not None and transport.get_extra_info("sslcontext") is not None
    return "https" if secure else "http"


WaitingPageHook = Callable[[web.Request, TargetRuntime, RequestFacts], web.StreamResponse | None]
"""A response for a browser loading a page from a cold target, or ``None`` to hold."""
