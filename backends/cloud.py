"""``cloud``: a managed OpenAI-compatible service through the ``openai`` SDK (the only importer of
``openai``). The SDK's own retries are off: the router owns retries and fallbacks.

Requests and answers pass through verbatim (the JSON the client sent, with the cloud's model
name; the JSON or event stream the cloud answered). SDK errors become :class:`CloudError` here,
and the API key is scrubbed from every message and log record that passes through.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import openai

from backends.cloud_api import CloudEndpoint, CloudError, CloudReply

log = logging.getLogger("warmgate.cloud")

_SDK_LOGGERS = ("openai", "httpx", "httpx2", "httpcore")
_REDACTED = "[redacted]"


class _Redact(logging.Filter):
    """Replaces the API key wherever it would appear in a log record of the SDK's loggers."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secret:
            return True
        message = record.getMessage()
        if self.secret in message:
            record.msg, record.args = message.replace(self.secret, _REDACTED), None
        return True


class OpenAICloud:
    def __init__(self, name: str, base_url: str, api_key: str, timeout: float) -> None:
        self.name = name
        self._secret = api_key
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0
        )
        self._filter = _Redact(api_key)
        for logger in _SDK_LOGGERS:
            logging.getLogger(logger).addFilter(self._filter)

    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, _REDACTED) if self._secret else text

    def _request(self, endpoint: CloudEndpoint, body: Mapping[str, Any]) -> Any:
        """The SDK call that sends ``body`` as it is: the typed method's required arguments,
        and the whole body as ``extra_body`` (which takes precedence over them)."""
        client = self._client
        extra = dict(body)
        if endpoint == "chat":
            return client.chat.completions.with_streaming_response.create(
                model=extra["model"], messages=[], extra_body=extra
            )
        if endpoint == "embeddings":
            # The SDK would ask for base64 when the client did not say; OpenAI's default is float.
            extra.setdefault("encoding_format", "float")
            return client.embeddings.with_streaming_response.create(
                model=extra["model"],
                input=extra.get("input", ""),
                encoding_format=extra["encoding_format"],
                extra_body=extra,
            )
        return client.images.with_streaming_response.generate(
            model=extra["model"], prompt=str(extra.get("prompt", "")), extra_body=extra
        )

    def _translate(self, exc: openai.OpenAIError) -> CloudError:
        where = f"cloud {self.name!r}"
        if isinstance(exc, openai.APITimeoutError):
            return CloudError(f"{where} did not answer in time", kind="timeout")
        if isinstance(exc, openai.APIConnectionError):
            return CloudError(f"{where} could not be reached", kind="connection")
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status in (401, 403):
                # Its message may quote part of the key: never pass it on.
                return CloudError(
                    f"{where} refused warmgate's credentials ({status})", kind="auth", status=status
                )
            error = _error_object(exc.body)
            if error is not None and isinstance(error.get("message"), str):
                error["message"] = self._scrub(error["message"])
            detail = error.get("message") if error else None
            message = f"{where} answered {status}" + (f": {detail}" if detail else "")
            return CloudError(message, kind="status", status=status, error=error)
        return CloudError(f"{where}: {self._scrub(type(exc).__name__)}", kind="connection")

    def _translate_any(self, exc: Exception) -> CloudError:
        """Also the transport's own errors, which escape the SDK while a body is read."""
        if isinstance(exc, openai.OpenAIError):
            return self._translate(exc)
        where = f"cloud {self.name!r}"
        if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
            return CloudError(f"{where} stopped sending in time", kind="timeout")
        return CloudError(f"{where} broke the connection ({type(exc).__name__})", kind="connection")

    async def create(self, endpoint: CloudEndpoint, body: Mapping[str, Any]) -> CloudReply:
        try:
            async with self._request(endpoint, body) as response:
                content = await response.read()
                return CloudReply(
                    status=response.status_code,
                    body=content,
                    content_type=response.headers.get("content-type", "application/json"),
                )
        except CloudError:
            raise
        except Exception as exc:
            raise self._translate_any(exc) from None

    @asynccontextmanager
    async def stream(
        self, endpoint: CloudEndpoint, body: Mapping[str, Any]
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        try:
            manager = self._request(endpoint, body)
            response = await manager.__aenter__()
        except Exception as exc:
            raise self._translate_any(exc) from None
        try:
            yield self._chunks(response)
        finally:
            await manager.__aexit__(None, None, None)

    async def _chunks(self, response: Any) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.iter_bytes():
                yield chunk
        except Exception as exc:
            raise self._translate_any(exc) from None

    async def close(self) -> None:
        await self._client.close()
        for logger in _SDK_LOGGERS:
            logging.getLogger(logger).removeFilter(self._filter)


def _error_object(body: object) -> dict[str, Any] | None:
    """The ``{"message", "type", "param", "code"}`` object of an error body, if it has one."""
    if isinstance(body, str | bytes):
        try:
            body = json.loads(body)
        except ValueError:
            return None
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        body = body["error"]
    if isinstance(body, Mapping) and "message" in body:
        return {k: body.get(k) for k in ("message", "type", "param", "code")}
    return None
