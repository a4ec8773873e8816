"""Errors on the OpenAI-compatible API: warmgate's error tree, answered in OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` with the matching status.

Every error carries ``x-should-retry: false`` and no ``Retry-After``: warmgate owns retries and
fallbacks, and the official clients would otherwise burn their retries in a second or sleep
through a cold start they cannot speed up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from router.errors import RequestError

SHOULD_RETRY = "x-should-retry"


class ApiError(RequestError):
    """An error of the API layer. ``type`` and ``param`` are OpenAI's fields."""

    type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, target: str | None = None):
        super().__init__(message, target=target)
        self.param = param


class InvalidRequest(ApiError):
    status = 400
    code = "invalid_request"


class InvalidApiKey(ApiError):
    status = 401
    code = "invalid_api_key"


class ModelNotFound(ApiError):
    status = 404
    code = "model_not_found"


class BudgetExhausted(ApiError):
    status = 429
    code = "cloud_budget_exhausted"
    type = "insufficient_quota"


class NotPlaced(ApiError):
    """The policy found nowhere to run the request now (private work with a cold local target,
    nothing configured that can start); the message says why."""

    status = 503
    code = "no_placement"
    type = "server_error"


class CloudFailed(ApiError):
    """The cloud failed and nothing local could take the request in time."""

    status = 502
    code = "cloud_error"
    type = "server_error"


class CloudRejected(ApiError):
    """The cloud refused the request itself (4xx): its own error object is passed on."""

    type = "invalid_request_error"

    def __init__(self, status: int, error: Mapping[str, Any] | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = dict(error) if error else None


_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error"}


def error_payload(error: RequestError) -> dict[str, Any]:
    if isinstance(error, CloudRejected) and error.error:
        return {"error": {**{"param": None, "code": None}, **error.error}}
    if isinstance(error, ApiError):
        kind, param = error.type, error.param
    else:
        kind = _TYPES.get(
            error.status, "server_error" if error.status >= 500 else "invalid_request_error"
        )
        param = None
    return {"error": {"message": error.message, "type": kind, "param": param, "code": error.code}}


def openai_error_response(error: RequestError) -> web.Response:
    return web.Response(
        status=error.status,
        text=json.dumps(error_payload(error)),
        content_type="application/json",
        headers={"Cache-Control": "no-store", SHOULD_RETRY: "false"},
    )
