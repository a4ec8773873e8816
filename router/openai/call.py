"""One request on the OpenAI-compatible API, as the placing code passes it around."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

from aiohttp import web

from router.config import ModelSpec
from router.openai.costs import Bound
from router.openai.credentials import Client
from router.openai.facts import Ask


def _request_key(name: str) -> web.RequestKey[str]:
    """A typed key of a request's storage where aiohttp has them (3.13 on, which warns about
    plain names); the plain name on older versions (the floor, 3.12.14)."""
    make = getattr(web, "RequestKey", None)
    return make(name, str) if make is not None else cast("web.RequestKey[str]", name)


REQUEST_ID: Final = _request_key("warmgate_request_id")
"""Set on every API request; answered as ``x-request-id``."""
UPSTREAM_ID: Final = _request_key("warmgate_upstream_request_id")
"""Set with :data:`REQUEST_ID`: the id a local target is sent. A client's own id as it is;
warmgate's own (``req_<hex>``) as the UUID it was made from, since some servers take only a UUID
there (llama-cpp-python's answers any other 400)."""
DECISION: Final = _request_key("warmgate_decision")
"""The last decision's header value; answered as ``X-Warmgate-Decision``."""

DECISION_HEADER: Final = "X-Warmgate-Decision"
MAX_WAIT_HEADER: Final = "X-Warmgate-Max-Wait"
PATHS: Final = {
    "chat": "/chat/completions",
    "embeddings": "/embeddings",
    "images": "/images/generations",
}
"""Endpoint of each model kind, below ``/v1`` (and below a local placement's ``base_path``)."""


@dataclass(slots=True)
class Call:
    request: web.Request
    request_id: str
    client: Client
    model: str
    spec: ModelSpec
    body: Mapping[str, Any]
    """The parsed JSON body, as the client sent it."""
    raw: bytes
    """The body's bytes, forwarded unchanged to a local target that knows the same model name."""
    ask: Ask
    started: float
    """Loop time the request arrived."""
    bound: Bound
    """The most it can use in the cloud: what a reservation is priced from."""
    private_reason: str | None = None
    notes: dict[str, str] = field(default_factory=dict)
    """Extra fields for the access log line."""
    first_bytes_at: float | None = None
    """Loop time the answer's first body bytes were in hand: its time to first token."""
    answered_from: str = ""
    """``local`` or ``cloud``: where those bytes came from."""

    def first_bytes(self, where: str, now: float) -> None:
        """The answer's first body bytes are here (the first only counts)."""
        if self.first_bytes_at is None:
            self.first_bytes_at, self.answered_from = now, where

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def stream(self) -> bool:
        return self.kind == "chat" and self.body.get("stream") is True
