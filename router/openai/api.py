"""The OpenAI-compatible API on the public listener: ``/v1/models``, ``/v1/chat/completions``,
``/v1/images/generations``, ``/v1/embeddings``.

Each request: authenticate, read the JSON, find the model (``router.openai.intake``), take a
snapshot of its placements, ask :func:`router.openai.policy.decide`, act (forward locally, hold,
call the cloud, or answer an error in OpenAI's shape), and after a cloud failure decide again
with only local left (``router.openai.placing``). Every response carries ``x-request-id`` and,
once placed, ``X-Warmgate-Decision``; every request is counted and logged here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from backends.cloud_api import Cloud
from backends.registry import make_cloud
from router.config import Config, logged_path
from router.errors import RequestError
from router.metrics import Families, Metrics
from router.openai.budget import Budget
from router.openai.call import DECISION, DECISION_HEADER, REQUEST_ID, Call
from router.openai.credentials import ClientKeys, cloud_api_keys, load_client_keys
from router.openai.errors import ModelNotFound, openai_error_response
from router.openai.facts import Rules, Snapshot
from router.openai.intake import Intake, begin
from router.openai.placing import Placer
from router.openai.ttft import FirstTokens
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.access")

TTFT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds: a warm engine's first token to a cold start waited through."""


def build_openai_api(
    config: Config,
    runtimes: Mapping[str, TargetRuntime],
    sessions: Mapping[str, aiohttp.ClientSession],
    metrics: Metrics,
) -> OpenAIApi:
    """The API for ``config.models``: client keys loaded, one cloud backend per configured cloud
    whose API key is set (the others are unavailable and their placements skipped)."""
    keys = load_client_keys(config)
    clouds = {
        name: make_cloud(name, config.clouds[name].base_url, key, config.clouds[name].timeout)
        for name, key in cloud_api_keys(config.clouds, config.environment).items()
    }
    return OpenAIApi(config, runtimes, sessions, metrics, clouds, keys)


class ApiMetrics:
    def __init__(self, metrics: Metrics, budget: Budget) -> None:
        make = Families(metrics.registry)
        self.decisions = make.counter(
            "decisions", "Placement decisions of API requests", ["model", "placement", "reason"]
        )
        self.cloud_spend = make.counter("cloud_spend_usd", "USD spent in each cloud", ["cloud"])
        self.cloud_spend_by_model = make.counter(
            "cloud_spend_by_model_usd",
            "USD spent in each cloud for each model (warmgate_cloud_spend_usd_total, by model)",
            ["cloud", "model"],
        )
        self.budget_remaining = make.gauge(
            "cloud_budget_remaining_usd",
            "USD the day's cloud budget still allows (reservations deducted)",
        )
        self.budget_remaining.set_function(budget.left)
        self.ttft = make.histogram(
            "ttft_seconds",
            "API answers: from the request's arrival to the first body bytes (time to first token)",
            ["model", "where"],
            TTFT_BUCKETS,
        )


class OpenAIApi:
    """The handlers: a request is read (:class:`Intake`), placed (:class:`Placer`), answered,
    counted and logged."""

    def __init__(
        self,
        config: Config,
        runtimes: Mapping[str, TargetRuntime],
        sessions: Mapping[str, aiohttp.ClientSession],
        metrics: Metrics,
        clouds: Mapping[str, Cloud],
        keys: ClientKeys,
        budget: Budget | None = None,
    ) -> None:
        self.config = config
        self.runtimes = runtimes
        self.metrics = metrics
        self.clouds = clouds
        self.budget = budget or Budget(config.policy.daily_cloud_budget_usd)
        self.api_metrics = ApiMetrics(metrics, self.budget)
        self.budget.on_spend = lambda cloud, usd: self.api_metrics.cloud_spend.labels(cloud).inc(
            usd
        )
        self.budget.on_model_spend = lambda cloud, model, usd: (
            self.api_metrics.cloud_spend_by_model.labels(cloud, model).inc(usd)
        )
        self.loop = asyncio.get_running_loop()
        self.intake = Intake(config, keys, self.loop)
        self.first_tokens = FirstTokens(self.loop.time)
        """Time to first token per model (``/status``'s ``ttft``)."""
        self.placer = Placer(
            config,
            runtimes,
            sessions,
            clouds,
            self.budget,
            self.api_metrics.decisions,
            self.loop,
        )

    @property
    def rules(self) -> Rules:
        return self.placer.rules

    def snapshot(self, call: Call) -> Snapshot:
        """Every placement of the call's model as it is now: what ``decide`` reads."""
        return self.placer.snapshot(call)

    # -- wiring -----------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/models/{model:.+}", self.get_model)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/v1/images/generations", self.generate_images)
        app.on_response_prepare.append(self._stamp)
        app[OPENAI_API] = self

    async def lifespan(self, app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx``: renders and cloud clients end with the app."""
        yield
        await self.close()

    async def close(self) -> None:
        await self.placer.close()
        await asyncio.gather(*(cloud.close() for cloud in self.clouds.values()))

    @staticmethod
    async def _stamp(request: web.Request, response: web.StreamResponse) -> None:
        request_id = request.get(REQUEST_ID)
        if request_id is None:
            return
        response.headers["x-request-id"] = request_id
        decision = request.get(DECISION)
        if decision is not None:
            response.headers[DECISION_HEADER] = decision

    # -- handlers ---------------------------------------------------------------------------

    def _model_object(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "warmgate"}

    async def list_models(self, request: web.Request) -> web.Response:
        begin(request)
        try:
            self.intake.authenticate(request)
        except RequestError as error:
            return openai_error_response(error)
        data = [self._model_object(name) for name in self.config.models]
        return web.json_response({"object": "list", "data": data})

    async def get_model(self, request: web.Request) -> web.Response:
        begin(request)
        name = request.match_info["model"]
        try:
            self.intake.authenticate(request)
            if name not in self.config.models:
                raise ModelNotFound(f"The model {name!r} does not exist", param="model")
        except RequestError as error:
            return openai_error_response(error)
        return web.json_response(self._model_object(name))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "embeddings")

    async def generate_images(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "images")

    # -- one request ------------------------------------------------------------------------

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        request_id = begin(request)
        call: Call | None = None
        try:
            call = await self.intake.call(request, kind, request_id)
            response = await self.placer.place(call)
        except RequestError as error:
            response = openai_error_response(error)
            if DECISION not in request:  # refused before any placement: say why all the same
                request[DECISION] = f"none; reason={error.code}"
            if call is not None:
                call.notes["error"] = error.code
        self._account(request, response, call)
        return response

    @staticmethod
    def _answered_chat(call: Call | None, response: web.StreamResponse) -> bool:
        """A chat answered with its first bytes: what time to first token counts."""
        return (
            call is not None
            and call.kind == "chat"
            and response.status < 400
            and call.first_bytes_at is not None
        )

    def _account(
        self, request: web.Request, response: web.StreamResponse, call: Call | None
    ) -> None:
        decision = request.get(DECISION, "-")
        placement = decision.split(";", 1)[0] if call is not None else "-"
        self.metrics.requests.labels(placement, request.method, str(response.status)).inc()
        if self._answered_chat(call, response):
            assert call is not None and call.first_bytes_at is not None
            seconds = call.first_bytes_at - call.started
            self.first_tokens.record(call.model, call.answered_from, seconds)
            self.api_metrics.ttft.labels(call.model, call.answered_from).observe(seconds)
        if not self.config.server.access_log:
            return
        elapsed = self.loop.time() - call.started if call is not None else 0.0
        notes = call.notes.items() if call is not None else ()
        extra = "".join(f" {k}={v}" for k, v in notes)  # a line with no notes ends in its time
        log.info(
            '%s "%s %s" %s model=%s decision="%s" id=%s %.3fs%s',
            request.remote,
            request.method,
            logged_path(request.raw_path, self.config.server.log_query),
            response.status,
            call.model if call is not None else "-",
            decision,
            request[REQUEST_ID],
            elapsed,
            extra,
        )


OPENAI_API = web.AppKey("openai_api", OpenAIApi)
