"""Reading one API request: its id, its caller, its JSON body (bounded), its model and what it
asks for, as a :class:`~router.openai.call.Call`; or the :class:`RequestError` that answers it.
No placing happens here (``router.openai.placing``)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import uuid
from collections.abc import Callable

from aiohttp import web

from backends.units import parse_duration
from router.config import Config
from router.errors import BodyTooLarge
from router.openai.call import MAX_WAIT_HEADER, PATHS, REQUEST_ID, UPSTREAM_ID, Call
from router.openai.costs import bound
from router.openai.credentials import Client, ClientKeys, Privacy
from router.openai.errors import InvalidApiKey, InvalidRequest, ModelNotFound
from router.openai.facts import Ask
from router.openai.fields import check_fields

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def begin(request: web.Request) -> str:
    """The request's id: the client's ``x-request-id`` when it is a sane one, else a new one
    (and what a local target is sent, :data:`~router.openai.call.UPSTREAM_ID`)."""
    incoming = request.headers.get("x-request-id", "")
    if _REQUEST_ID.match(incoming):
        # A client's own goes everywhere as it is, even one that looks like warmgate's.
        request_id = upstream = incoming
    else:
        made = uuid.uuid4()
        request_id, upstream = f"req_{made.hex}", str(made)
    request[REQUEST_ID] = request_id
    request[UPSTREAM_ID] = upstream
    return request_id


def _noted(odd: list[str]) -> Callable[[str], float]:
    def constant(text: str) -> float:  # NaN, Infinity, -Infinity
        odd.append(text)
        return float(text)

    return constant


def _finite(odd: list[str]) -> Callable[[str], float]:
    def real(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):  # 1e400
            odd.append(text)
        return value

    return real


class Intake:
    """Authentication, the body, the model and the ask of one request (``config.models``,
    ``api.max_body``, the client keys, the private rule)."""

    def __init__(self, config: Config, keys: ClientKeys, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.policy = config.policy
        self.keys = keys
        self.privacy = Privacy.from_rule(config.policy.private)
        self.loop = loop

    def authenticate(self, request: web.Request) -> Client:
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

    async def call(self, request: web.Request, kind: str, request_id: str) -> Call:
        """The request as a :class:`Call` of ``kind`` (``chat``, ``embeddings``, ``images``)."""
        client = self.authenticate(request)
        raw = await self._read(request)
        odd: list[str] = []
        try:
            body = json.loads(raw, parse_constant=_noted(odd), parse_float=_finite(odd))
        except ValueError as exc:
            raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise InvalidRequest("the request body is nested too deeply") from None
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
        check_fields(kind, body)
        if odd:  # Python's json reads them; JSON has none, and a server behind may not read them
            raise InvalidRequest(
                f"the request body holds {odd[0][:20]}, which is no JSON number "
                "(NaN, Infinity and numbers beyond 1e308 are refused)"
            )
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
