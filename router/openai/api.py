"""The OpenAI-compatible API on the public listener: ``/v1/models``, ``/v1/chat/completions``,
``/v1/images/generations``, ``/v1/embeddings``.

Each request: authenticate, read the JSON, find the model, take a snapshot of its placements, ask
:func:`router.openai.policy.decide`, act (forward locally, hold, call the cloud, or answer an error
in OpenAI's shape), and after a cloud failure decide again with only local left. Every response
carries ``x-request-id`` and, once placed, ``X-Warmgate-Decision``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge

from backends.base import Cloud
from backends.registry import make_cloud
from backends.units import parse_duration
from router.config import Config
from router.errors import BodyTooLarge, RequestError
from router.metrics import Metrics
from router.openai.budget import Budget
from router.openai.call import (
    DECISION,
    DECISION_HEADER,
    MAX_WAIT_HEADER,
    PATHS,
    REQUEST_ID,
    Call,
)
from router.openai.cloud import CloudCaller, CloudUnavailable
from router.openai.costs import bound
from router.openai.credentials import Client, ClientKeys, Privacy, cloud_api_keys, load_client_keys
from router.openai.errors import (
    BudgetExhausted,
    CloudFailed,
    InvalidApiKey,
    InvalidRequest,
    ModelNotFound,
    NotPlaced,
    openai_error_response,
)
from router.openai.images import ComfyImages, load_workflow
from router.openai.local import api_facts, forward_local
from router.openai.policy import (
    Action,
    Ask,
    CloudOption,
    Decision,
    LocalOption,
    Rules,
    Snapshot,
    decide,
)
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.access")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


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
        r, ns = metrics.registry, "warmgate"
        self.decisions = PromCounter(
            "decisions",
            "Placement decisions of API requests",
            ["model", "placement", "reason"],
            namespace=ns,
            registry=r,
        )
        self.cloud_spend = PromCounter(
            "cloud_spend_usd", "USD spent in each cloud", ["cloud"], namespace=ns, registry=r
        )
        self.budget_remaining = Gauge(
            "cloud_budget_remaining_usd",
            "USD the day's cloud budget still allows (reservations deducted)",
            namespace=ns,
            registry=r,
        )
        self.budget_remaining.set_function(budget.left)


class OpenAIApi:
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
        self.policy = config.policy
        self.runtimes = runtimes
        self.sessions = sessions
        self.metrics = metrics
        self.clouds = clouds
        self.keys = keys
        self.budget = budget or Budget(config.policy.daily_cloud_budget_usd)
        self.api_metrics = ApiMetrics(metrics, self.budget)
        self.budget.on_spend = lambda cloud, usd: self.api_metrics.cloud_spend.labels(cloud).inc(
            usd
        )
        self.privacy = Privacy.from_rule(config.policy.private)
        self.rules = Rules(config.policy.overflow_queue_depth, config.policy.warm_on_cloud)
        self.loads: Counter[str] = Counter()
        """API requests in progress per local target (event streams included)."""
        retries = {name: spec.retries for name, spec in config.clouds.items()}
        self.cloud = CloudCaller(clouds, retries, self.budget)
        self.images = ComfyImages(self.loads)
        self.workflows = {
            (model, i): load_workflow(config.base_dir, p.workflow)
            for model, spec in config.models.items()
            for i, p in enumerate(spec.placements)
            if p.workflow is not None
        }
        self._wake_rules: dict[tuple[str, str], bool] = {}
        self.loop = asyncio.get_running_loop()

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
        await self.images.close()
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
        self._begin(request)
        try:
            self._authenticate(request)
        except RequestError as error:
            return openai_error_response(error)
        data = [self._model_object(name) for name in self.config.models]
        return web.json_response({"object": "list", "data": data})

    async def get_model(self, request: web.Request) -> web.Response:
        self._begin(request)
        name = request.match_info["model"]
        try:
            self._authenticate(request)
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

    def _begin(self, request: web.Request) -> str:
        incoming = request.headers.get("x-request-id", "")
        request_id = incoming if _REQUEST_ID.match(incoming) else f"req_{uuid.uuid4().hex}"
        request[REQUEST_ID] = request_id
        return request_id

    def _authenticate(self, request: web.Request) -> Client:
        client = self.keys.identify(request.headers.get("Authorization"))
        if client is None:
            if "Authorization" not in request.headers:
                raise InvalidApiKey("You didn't provide an API key: Authorization: Bearer <key>")
            raise InvalidApiKey("Incorrect API key provided")
        return client

    async def _read(self, request: web.Request) -> bytes:
        limit = self.config.api.max_body
        length = request.content_length
        if length is not None and length > limit:
            raise BodyTooLarge(f"request body of {length} bytes is larger than {limit}")
        chunks: list[bytes] = []
        total = 0
        async for chunk in request.content.iter_any():
            total += len(chunk)
            if total > limit:
                raise BodyTooLarge(f"request body is larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _max_wait(self, request: web.Request, spec_wait: float | None) -> float:
        header = request.headers.get(MAX_WAIT_HEADER)
        if header is not None:
            try:
                return parse_duration(header)
            except ValueError as exc:
                raise InvalidRequest(f"{MAX_WAIT_HEADER}: {exc}", param=MAX_WAIT_HEADER) from None
        return spec_wait if spec_wait is not None else self.policy.max_wait

    async def _call(self, request: web.Request, kind: str, request_id: str) -> Call:
        client = self._authenticate(request)
        raw = await self._read(request)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidRequest("the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("model: expected the name of a model", param="model")
        spec = self.config.models.get(model)
        if spec is None:
            raise ModelNotFound(f"The model {model!r} does not exist", param="model")
        if spec.kind != kind:
            raise InvalidRequest(
                f"model {model!r} is served at /v1{PATHS[spec.kind]}, not /v1{PATHS[kind]}",
                param="model",
            )
        if kind == "chat" and not isinstance(body.get("messages"), list):
            raise InvalidRequest("messages: expected a list of messages", param="messages")
        private = self.privacy.reason(request.headers, client)
        ask = Ask(private=private is not None, max_wait=self._max_wait(request, spec.max_wait))
        return Call(
            request,
            request_id,
            client,
            model,
            spec,
            body,
            raw,
            ask,
            self.loop.time(),
            bound(kind, body, self.policy.assumed_output_tokens),
            private_reason=private,
        )

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        request_id = self._begin(request)
        call: Call | None = None
        try:
            call = await self._call(request, kind, request_id)
            response = await self._place(call)
        except RequestError as error:
            response = openai_error_response(error)
            if DECISION not in request:  # refused before any placement: say why all the same
                request[DECISION] = f"none; reason={error.code}"
            if call is not None:
                call.notes["error"] = error.code
        self._account(request, response, call)
        return response

    def _account(
        self, request: web.Request, response: web.StreamResponse, call: Call | None
    ) -> None:
        decision = request.get(DECISION, "-")
        placement = decision.split(";", 1)[0] if call is not None else "-"
        self.metrics.requests.labels(placement, request.method, str(response.status)).inc()
        if not self.config.server.access_log:
            return
        elapsed = self.loop.time() - call.started if call is not None else 0.0
        extra = " ".join(f"{k}={v}" for k, v in call.notes.items()) if call is not None else ""
        log.info(
            '%s "%s %s" %s model=%s decision="%s" id=%s %.3fs %s',
            request.remote,
            request.method,
            request.path,
            response.status,
            call.model if call is not None else "-",
            decision,
            request[REQUEST_ID],
            elapsed,
            extra,
        )

    # -- placing ----------------------------------------------------------------------------

    def snapshot(self, call: Call) -> Snapshot:
        """Every placement of the call's model as it is now: what :func:`decide` reads."""
        locals_: list[LocalOption] = []
        clouds: list[CloudOption] = []
        for i, p in enumerate(call.spec.placements):
            target = p.target
            if target is not None:
                rt = self.runtimes[target]
                state, activity = rt.cell.current, rt.activity
                locals_.append(
                    LocalOption(
                        i,
                        target,
                        state.phase,
                        state.since,
                        rt.servable_now() is not None,
                        max(self.loads[target], activity.in_flight),
                        activity.held,
                        rt.spec.scaling.max_held,
                        self._predicted(rt),
                        state.retry_at,
                        self._wakes(rt, call.kind),
                    )
                )
            else:
                assert p.cloud is not None and p.model is not None
                cost = call.bound.price(p.cost)
                clouds.append(CloudOption(i, p.cloud, p.model, p.cloud in self.clouds, cost))
        return Snapshot(tuple(locals_), tuple(clouds), self.budget.left(), self.loop.time())

    def _wakes(self, runtime: TargetRuntime, kind: str) -> bool:
        """Whether an API request may start the target (the engine's rule; fixed by config)."""
        key = (runtime.name, kind)
        wakes = self._wake_rules.get(key)
        if wakes is None:
            wakes = self._wake_rules[key] = runtime.may_wake(api_facts(PATHS[kind]))
        return wakes

    def _predicted(self, runtime: TargetRuntime) -> float:
        return runtime.predicted_cold_start(self.policy.assumed_cold_start)

    def _record(self, call: Call, decision: Decision) -> None:
        call.request[DECISION] = decision.header
        self.api_metrics.decisions.labels(call.model, decision.placement, decision.reason).inc()
        log.debug(
            "%s: %s -> %s (%s)", call.request_id, call.model, decision.header, decision.detail
        )
        if decision.warm is not None:
            self.runtimes[decision.warm].request_start()
            call.notes["warming"] = decision.warm

    async def _place(self, call: Call) -> web.StreamResponse:
        ask = call.ask
        failure: CloudUnavailable | None = None
        while True:
            decision = decide(ask, self.snapshot(call), self.rules)
            self._record(call, decision)
            if decision.action is Action.REJECT:
                raise _rejection(decision, failure)
            if decision.action is not Action.CLOUD:
                assert decision.local is not None
                return await self._local(call, decision.local.position)
            assert decision.cloud is not None and not ask.private
            try:
                return await self.cloud.run(call, call.spec.placements[decision.cloud.position])
            except CloudUnavailable as exc:
                if failure is not None or not any(p.target for p in call.spec.placements):
                    raise CloudFailed(str(exc)) from None
                failure = exc
                waited = self.loop.time() - call.started
                ask = dataclasses.replace(ask, cloud_failed=True, waited=waited)
                call.notes["cloud_failed"] = exc.error.kind

    async def _local(self, call: Call, index: int) -> web.StreamResponse:
        placement = call.spec.placements[index]
        assert placement.target is not None
        runtime = self.runtimes[placement.target]
        session = self.sessions[placement.target]
        if call.kind == "images":
            workflow = self.workflows[(call.model, index)]
            return await self.images.generate(call, runtime, session, placement, workflow)
        return await forward_local(
            call,
            runtime,
            session,
            placement,
            self.loads,
            trust_forwarded=self.config.server.trust_forwarded,
        )


def _rejection(decision: Decision, failure: CloudUnavailable | None) -> RequestError:
    if decision.status == 429:
        return BudgetExhausted(decision.detail)
    if decision.status == 502:
        cause = f"{failure.error.message}; " if failure is not None else ""
        return CloudFailed(cause + decision.detail)
    return NotPlaced(decision.detail)


OPENAI_API = web.AppKey("openai_api", OpenAIApi)
