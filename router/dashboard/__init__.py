"""The operator's view on the admin listener: the dashboard page, its live event stream, the
JSON it is drawn from, the actions (wake, park, release) and the gauges the alert rules read."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from router.cluster.replicas import Replicas
from router.dashboard import page, stream
from router.dashboard.actions import Actions, read_token
from router.dashboard.events import EventBus
from router.dashboard.gauges import add_gauges
from router.dashboard.today import Today
from router.dashboard.view import Sources
from router.keys import CONFIG, METRICS, RUNTIMES
from router.openai.api import OPENAI_API

STATIC = Path(__file__).resolve().parent.parent / "static"
"""The page's script and style: package data of ``router`` (pyproject's package-data)."""


def add_dashboard(
    admin: web.Application, public: web.Application, replicas: Replicas | None
) -> None:
    """Wire the operator's view into the admin app (its CONFIG, METRICS and RUNTIMES set);
    the public app holds the OpenAI-compatible API when models are configured."""
    config, metrics, runtimes = admin[CONFIG], admin[METRICS], admin[RUNTIMES]
    token = read_token(config)  # first: a missing token file stops the start with its error
    api = public.get(OPENAI_API)
    loop = asyncio.get_running_loop()
    add_gauges(metrics, runtimes, api.budget if api is not None else None)
    today = Today(
        runtimes,
        loop.time(),
        metrics.gpu_seconds,
        api.api_metrics.decisions if api is not None else None,
        api.api_metrics.cloud_spend if api is not None else None,
    )
    bus = EventBus(today, loop)
    for name, runtime in runtimes.items():
        bus.watch(name, runtime.cell)
        bus.follow_rollouts(name, runtime.rollout.listeners)
    if replicas is not None:
        _watch_leadership(bus, replicas)
    actions = Actions(token, runtimes, bus)
    src = Sources(config, runtimes, today, bus, api, replicas, actions.allowed)
    publisher = stream.Publisher(src)
    admin[stream.PUBLISHER] = publisher
    admin.cleanup_ctx.append(publisher.run)

    async def end_streams(app: web.Application) -> None:
        publisher.close()

    admin.on_shutdown.append(end_streams)
    admin.router.add_get("/", page.dashboard)
    admin.router.add_static("/static/", STATIC)
    admin.router.add_get("/status", stream.status)
    admin.router.add_get("/events", stream.events)
    admin.router.add_post("/targets/{name}/{action:wake|release|park}", actions.handle)


def _watch_leadership(bus: EventBus, replicas: Replicas) -> None:
    leading = replicas.leading()

    def changed() -> None:
        nonlocal leading
        now = replicas.leading()
        if now != leading:
            leading = now
            reason = "this replica leads now" if now else "this replica no longer leads"
            bus.add(None, "leader", f"{replicas.identity}: {reason}")

    replicas.on_update.append(changed)
