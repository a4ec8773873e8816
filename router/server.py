"""Running the listeners: uvloop, a header timeout against slowloris clients, and a SIGTERM
drain (stop accepting, let in-flight requests finish up to ``drain_grace``, exit 0)."""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import resource
import signal
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestHandler, _ErrInfo

from router.app import Apps, build_apps
from router.cluster.keda import ScalerServer
from router.config import Config
from router.errors import ListenError
from router.http.bad_requests import BadRequestLog
from router.http.intake import refusal
from router.keys import RUNTIMES

log = logging.getLogger("warmgate")


class _MessageQueue(list[Any]):
    """aiohttp's per-connection queue of parsed requests, as a list: a deque reserves ~600 bytes
    per connection up front, and this queue seldom holds more than one request."""

    __slots__ = ()

    def popleft(self) -> Any:
        return self.pop(0)

    def appendleft(self, item: Any) -> None:
        self.insert(0, item)


_SOCKNAMES: dict[Any, Any] = {}
_PEERS: dict[Any, Any] = {}


def _shared(cache: dict[Any, Any], value: Any) -> Any:
    """One object per distinct value (bounded: the cache is emptied when it grows large)."""
    if len(cache) >= 4096:
        cache.clear()
    return cache.setdefault(value, value)


class _GuardedHandler(RequestHandler):
    """A connection that must deliver each complete request head within its server's
    ``header_timeout``: the first from when the connection opens, each later one on a
    keep-alive connection from its first byte (the wait before it is ``keepalive_timeout``'s).

    Lean, since every request held or in flight costs one: the message queue is a list, and
    aiohttp's first keep-alive timer is dropped because the head timer already closes a
    connection that sends nothing (aiohttp arms its own again after each request)."""

    __slots__ = ("_after_chunked", "_head_timer", "_refused")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False
        """A request was refused (see :meth:`_refuse`): nothing more is read."""
        self._after_chunked = False
        """A chunked request was parsed: it is the connection's last (see :meth:`_refuse`)."""
        if type(getattr(self, "_messages", None)) is collections.deque:
            self._messages = _MessageQueue()  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        limit = getattr(self._manager, "header_timeout", 10.0)
        self._head_timer: asyncio.TimerHandle | None = self._loop.call_later(
            limit, self._head_too_slow
        )
        keepalive = getattr(self, "_keepalive_handle", None)
        if keepalive is not None and limit <= self._keepalive_timeout:
            keepalive.cancel()
            self._keepalive_handle = None
            self._next_keepalive_close_time = 0.0

    # aiohttp keeps both addresses per connection and each request refers to them: shared
    # objects here make a held request ~300 bytes lighter. request.remote is unchanged.

    @property
    def sockname(self) -> Any:
        """The local address: one tuple shared by the listener's connections."""
        transport = self.transport
        if transport is None:
            return None
        name = transport.get_extra_info("sockname")
        return _shared(_SOCKNAMES, name) if isinstance(name, tuple) else name

    @property
    def peername(self) -> Any:
        """The client's host alone (aiohttp's ``request.remote`` is the same), one string shared
        by that client's connections; the transport still has the full address."""
        transport = self.transport
        if transport is None:
            return None
        name = transport.get_extra_info("peername")
        return _shared(_PEERS, name[0]) if isinstance(name, tuple) and name else name

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # after a refused request: not one more byte of this connection is read
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads:
            self._refuse(self._request_count - heads)
        if self._request_count != heads or self._task_handler is None:  # a head is complete
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
        elif self._head_timer is None and data and self._between_requests():
            # The first bytes of the next head on a keep-alive connection: it has as long.
            limit = getattr(self._manager, "header_timeout", 10.0)
            self._head_timer = self._loop.call_later(limit, self._head_too_slow)

    def _refuse(self, parsed: int) -> None:
        """Of the ``parsed`` requests just queued, the first that warmgate refuses
        (router.http.intake) is answered 400 in its turn, as aiohttp answers what it cannot
        parse, and the connection closed with it; nothing after it is read or dispatched (it
        may be a request smuggled inside it). A chunked request is the connection's last: it
        closes after it, and nothing parsed after it is dispatched."""
        messages = self._messages
        for index in range(len(messages) - parsed, len(messages)):
            message, payload = messages[index]
            if isinstance(message, _ErrInfo):
                return
            if self._after_chunked:
                # aiohttp's C parser gives a chunked request's trailer fields to the request
                # after it: none after a chunked one is served (it closes the connection).
                while len(messages) > index:
                    messages.pop()
                return
            if message.chunked:
                messages[index] = (message._replace(should_close=True), payload)
                self._after_chunked = True
            why = refusal(message.method, message.path, message.headers, message.version)
            if why is not None:
                error = BadHttpMessage(why)
                messages[index] = (_ErrInfo(status=400, exc=error, message=why), EMPTY_PAYLOAD)
                while len(messages) > index + 1:
                    messages.pop()
                self._refused = True
                return

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request that could not be parsed or was refused: one rate-limited warning line
        (aiohttp logs each at ERROR with a traceback); anything else as aiohttp handles it."""
        if status >= 500 or not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        why = (message or exc.message or type(exc).__name__).splitlines()[0]
        getattr(self._manager, "bad_requests", _BAD_REQUESTS).refused(
            self._loop.time(), request.remote, status, why
        )
        if request.writer.output_size > 0:
            raise ConnectionError("a response began already: no error response can follow")
        response = web.Response(status=status, text=message, content_type="text/plain")
        response.force_close()
        return response

    def _between_requests(self) -> bool:
        """The connection waits for its next request (the last one fully answered, its body
        read): bytes arriving now begin a head, never a body or a websocket's frames."""
        waiter = self._waiter
        return waiter is not None and not waiter.done()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self._request_in_progress:  # a head still incomplete: a slowloris client
            self.force_close()


_BAD_REQUESTS = BadRequestLog()


class _GuardedServer(web.Server):
    header_timeout = 10.0
    bad_requests = _BAD_REQUESTS

    def __call__(self) -> RequestHandler:
        return _GuardedHandler(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    def __init__(self, app: web.Application, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._header_timeout = header_timeout

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The same server with guarded connections: aiohttp has no limit on a trickling head.
        server.__class__ = _GuardedServer
        server.header_timeout = self._header_timeout  # type: ignore[attr-defined]
        server.bad_requests = BadRequestLog()  # type: ignore[attr-defined]
        return server


def raise_fd_limit() -> None:
    """Idle keep-alive connections are cheap; do not let the fd limit be what refuses them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Server:
    """Both listeners of one warmgate process."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.apps: Apps | None = None
        self._runners: list[web.AppRunner] = []
        self.public_port = 0
        self.admin_port = 0
        self.scaler: ScalerServer | None = None
        """KEDA's external scaler (gRPC), when ``scaler_listen`` is set."""
        self.scaler_port = 0

    async def start(self) -> None:
        config = self.config
        self.apps = build_apps(config)
        settings = config.server
        public = _Runner(
            self.apps.public,
            settings.header_timeout,
            handler_cancellation=True,
            shutdown_timeout=settings.drain_grace,
            keepalive_timeout=settings.keepalive_timeout,
            access_log=None,
            timeout_ceil_threshold=5.0,  # aiohttp's default, as a float: not one per connection
        )
        admin = web.AppRunner(self.apps.admin, access_log=None, shutdown_timeout=2.0)
        self._runners = [public, admin]
        await public.setup()
        await admin.setup()
        site = web.TCPSite(public, config.listen.host, config.listen.port, backlog=1024)
        await site.start()
        admin_site = web.TCPSite(admin, config.admin_listen.host, config.admin_listen.port)
        await admin_site.start()
        self.public_port = _bound_port(public)
        self.admin_port = _bound_port(admin)
        if config.scaler_listen is not None:  # after the lifecycles opened: it reads their state
            self.scaler = ScalerServer(
                self.apps.public[RUNTIMES], config.scaler_listen, self.apps.replicas
            )
            self.scaler_port = await self.scaler.start()
        self.apps.readiness.listening = True
        log.info(
            "warmgate listening on %s:%d (admin %s:%d), %d targets",
            config.listen.host,
            self.public_port,
            config.admin_listen.host,
            self.admin_port,
            len(config.targets),
        )

    async def stop(self) -> None:
        """Stop accepting, drain in-flight requests up to ``drain_grace``, stop the targets."""
        if self.apps is not None:
            self.apps.readiness.listening = False
            for runtime in self.apps.public[RUNTIMES].values():
                runtime.shut_down()  # no cold start begins; held requests get 503 now
        for runner in self._runners:
            await runner.cleanup()
        self._runners = []
        if self.scaler is not None:  # last: KEDA hears the targets' state through the drain
            await self.scaler.stop()
            self.scaler = None


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    return 0


async def serve(config: Config) -> None:
    raise_fd_limit()
    server = Server(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except OSError as exc:
        await server.stop()
        raise ListenError(f"cannot listen: {exc.strerror or exc}") from exc
    # Everything imported and built so far lives as long as the process: keep it out of the
    # cyclic GC's full collections, which would otherwise walk it (~70 ms on a slow core) while
    # requests wait.
    gc.collect()
    gc.freeze()
    await stop.wait()
    log.info("stopping: draining in-flight requests (up to %.0fs)", config.server.drain_grace)
    await server.stop()
    log.info("stopped")
