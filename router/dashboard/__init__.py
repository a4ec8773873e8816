"""The operator's view on the admin listener: the dashboard page, its live event stream, the
JSON it is drawn from, the actions (wake, park, release) and the gauges the alert rules read."""

from __future__ import annotations

from aiohttp import web

from router.cluster.replicas import Replicas
from router.dashboard.gauges import add_gauges
from router.keys import METRICS, RUNTIMES
from router.openai.api import OPENAI_API


def add_dashboard(
    admin: web.Application, public: web.Application, replicas: Replicas | None
) -> None:
    """Wire the operator's view into the admin app (its CONFIG, METRICS and RUNTIMES set);
    the public app holds the OpenAI-compatible API when models are configured."""
    api = public.get(OPENAI_API)
    add_gauges(admin[METRICS], admin[RUNTIMES], api.budget if api is not None else None)
