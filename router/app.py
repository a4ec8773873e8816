"""Wiring: one builder, innermost layer first (config -> backends -> runtimes -> lifecycles ->
dispatcher -> apps). Background work lives in ``cleanup_ctx``: it starts and stops with the app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from backends.documents import own_store
from backends.registry import make_backend, make_engine, make_membership
from router.admin import build_admin_app
from router.cluster.replicas import Replicas
from router.cluster.routes import add_routes
from router.config import Config
from router.dashboard import add_dashboard
from router.http.h1.connector import UpstreamConnector
from router.http.h1.framer import MAX_HEAD
from router.http.websocket import UpstreamSocket
from router.keys import CONFIG, METRICS, READINESS, RUNTIMES, Readiness
from router.metrics import Metrics
from router.openai.api import build_openai_api
from router.openai.budget import kept
from router.routing.dispatch import Dispatcher
from router.routing.match import RouteTable
from router.routing.waiting import PREFIX, WaitingPages
from router.scale.activity import StreamEnd
from router.scale.lifecycle import Lifecycle
from router.scale.persist import FileStore
from router.scale.pool_runtime import PoolRuntime
from router.scale.targets import TargetRuntime


async def _reserved(request: web.Request) -> web.Response:
    raise web.HTTPNotFound(text="/.warmgate/ is reserved for warmgate and never forwarded")


@dataclass
class Apps:
    public: web.Application
    admin: web.Application
    readiness: Readiness
    replicas: Replicas | None = None


def _session(runtime: TargetRuntime) -> aiohttp.ClientSession:
    spec = runtime.spec
    connector = UpstreamConnector(  # aiohttp's (websockets) + warmgate's own HTTP pool
        limit=spec.limits.max_connections,
        keepalive_timeout=spec.timeouts.upstream_idle,
        queued=runtime.holding,  # a request waiting for a free connection counts as held
        limit_per_host=0,
        ttl_dns_cache=60,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=spec.timeouts.connect),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),  # never keep one user's cookies for the next
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        trust_env=False,
        ws_response_class=UpstreamSocket,  # a close without a code forwarded as one
        max_line_size=MAX_HEAD,  # an upstream head's lines, as the forwarding pool takes them
        max_field_size=MAX_HEAD,
    )


def _file_store(config: Config, prefix: str = "") -> FileStore | None:
    """Files under ``state_dir`` (``None`` where the config keeps no state)."""
    path = config.state_path
    return FileStore(path, prefix) if path is not None else None


def build_apps(config: Config) -> Apps:
    metrics = Metrics()
    runtimes = _runtimes(config, metrics)
    replicas = _replicas(config, runtimes, metrics)
    for pool, spec in config.pools.items():  # each member's runtime knows its pool from here
        members = [runtimes[name] for name, t in config.targets.items() if t.pool == pool]
        PoolRuntime(pool, spec, members, metrics, asyncio.get_running_loop(), replicas)
    readiness = Readiness(runtimes=runtimes, replicas=replicas)
    sessions: dict[str, aiohttp.ClientSession] = {}
    dispatcher = Dispatcher(
        RouteTable(config),
        runtimes,
        sessions,
        metrics,
        trust_forwarded=config.server.trust_forwarded,
        access_log=config.server.access_log,
        log_query=config.server.log_query,
    )

    async def close_streams(app: web.Application) -> None:
        """Websockets and event streams would hold the drain for its whole grace period."""
        for runtime in runtimes.values():
            await runtime.activity.close_streams(StreamEnd.SHUTDOWN)

    public = web.Application(handler_args={"max_field_size": 16384})
    public[CONFIG] = config
    public[METRICS] = metrics
    public[RUNTIMES] = runtimes
    public.cleanup_ctx.append(_run_targets(runtimes, replicas, sessions))
    public.on_shutdown.append(close_streams)
    waiting = WaitingPages(runtimes, dispatcher.table)
    dispatcher.waiting_page = waiting
    public.router.add_get(PREFIX + "{kind}/{target}", waiting.handle)
    public.router.add_route("*", PREFIX + "{tail:.*}", _reserved)
    if config.models:  # the OpenAI-compatible API; without models, /v1 is proxied like any path
        _add_api(public, config, runtimes, sessions, metrics, replicas)
    public.router.add_route("*", "/{tail:.*}", dispatcher.handle, expect_handler=dispatcher.expect)

    admin = build_admin_app()
    admin[CONFIG] = config
    admin[METRICS] = metrics
    admin[RUNTIMES] = runtimes
    admin[READINESS] = readiness
    if replicas is not None:
        add_routes(admin, replicas)
    add_dashboard(admin, public, replicas)
    return Apps(public, admin, readiness, replicas)


def _runtimes(config: Config, metrics: Metrics) -> dict[str, TargetRuntime]:
    """Each target's runtime: its backend, its engine, and where what it learns is kept."""
    loop = asyncio.get_running_loop()
    runtimes: dict[str, TargetRuntime] = {}
    env = config.environment  # read once, at load: backends get plain values
    children = config.child_environment  # without the cloud keys and the replicas' token
    for name, target in config.targets.items():
        backend = make_backend(
            name, target.backend, config.base_dir, environ=children, kube_environ=env.kube
        )
        engine = make_engine(target.engine_spec(config.base_dir), backend)
        runtime = runtimes[name] = TargetRuntime(
            name,
            target,
            backend,
            engine,
            metrics,
            loop,
            config.economics,
            assumed_cold_start=config.policy.assumed_cold_start,
        )
        # what it learns survives restarts: on its Deployment, or in a file under state_dir
        runtime.learned.store = own_store(backend) or _file_store(config, f"{name}.")
        runtime.timeline.store = runtime.learned.store  # its day, beside what it learned
    return runtimes


def _replicas(
    config: Config, runtimes: dict[str, TargetRuntime], metrics: Metrics
) -> Replicas | None:
    """The other replicas of this router, where ``replicas:`` is configured."""
    if config.replicas is None:
        return None
    env = config.environment
    membership = make_membership(
        config.replicas, kube_environ=env.kube, pod_name=env.pod_name, pod_ip=env.pod_ip
    )
    return Replicas(membership, config.replicas, runtimes, metrics, token=config.replicas_token)


def _run_targets(
    runtimes: dict[str, TargetRuntime],
    replicas: Replicas | None,
    sessions: dict[str, aiohttp.ClientSession],
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The public app's lifespan: each target's upstream session and lifecycle (and the
    replicas) opened before it serves, closed after its drain."""

    async def run_targets(app: web.Application) -> AsyncIterator[None]:
        for name, runtime in runtimes.items():
            sessions[name] = _session(runtime)
        lifecycles = [Lifecycle(runtime, replicas) for runtime in runtimes.values()]
        try:
            if replicas is not None:  # the others' activity is known before a drain is decided
                await replicas.open()
            for lifecycle in lifecycles:
                await lifecycle.open()
        except BaseException:  # a backend refused to start: leave nothing running behind
            await asyncio.gather(*(lifecycle.close() for lifecycle in lifecycles))
            if replicas is not None:
                await replicas.close()
            await asyncio.gather(*(session.close() for session in sessions.values()))
            raise
        yield
        await asyncio.gather(*(lifecycle.close() for lifecycle in lifecycles))
        if replicas is not None:  # after the drain: the leadership is handed over at once
            await replicas.close()
        await asyncio.gather(*(session.close() for session in sessions.values()))

    return run_targets


def _add_api(
    public: web.Application,
    config: Config,
    runtimes: dict[str, TargetRuntime],
    sessions: dict[str, aiohttp.ClientSession],
    metrics: Metrics,
    replicas: Replicas | None,
) -> None:
    """The OpenAI-compatible API on ``/v1``, with its day's cloud budget kept."""
    api = build_openai_api(config, runtimes, sessions, metrics)
    if replicas is not None:  # the day's cloud budget is the replicas' together
        replicas.share_budget(api.budget)
    api.add_routes(public)
    public.cleanup_ctx.append(api.lifespan)
    # the day's spend survives restarts: one record per replica in the replicas' ConfigMap,
    # else a file under state_dir
    spend_store = own_store(replicas.membership) if replicas is not None else None
    if replicas is not None and spend_store is not None:
        key = f"budget.{replicas.identity}"
        public.cleanup_ctx.append(kept(api.budget, spend_store, key, replicas.spend.remember))
    elif (budget_file := _file_store(config)) is not None:
        public.cleanup_ctx.append(kept(api.budget, budget_file))
