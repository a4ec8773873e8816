"""A managed OpenAI-compatible service, as the router sees it: :class:`Cloud`, what it answers
(:class:`CloudReply`) and how it fails (:class:`CloudError`). :mod:`backends.cloud` makes one
with the ``openai`` SDK (the only importer of ``openai``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

CloudEndpoint = Literal["chat", "embeddings", "images"]


class CloudError(Exception):
    """A cloud call that failed, translated at the cloud backend's boundary from the SDK's errors.

    ``kind``: ``timeout``, ``connection``, ``auth`` (the cloud refused warmgate's credentials),
    ``status`` (any other error status). The message never carries the cloud's API key."""

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        status: int | None = None,
        error: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.status = status
        self.error = dict(error) if error else None
        """The cloud's own OpenAI error object (``{"message", "type", ...}``), key scrubbed."""

    @property
    def retryable(self) -> bool:
        """Worth another try or a fallback: no answer, or a 5xx/408/429 from the cloud."""
        if self.kind in ("timeout", "connection"):
            return True
        return (
            self.kind == "status"
            and self.status is not None
            and (self.status >= 500 or self.status in (408, 429))
        )


@dataclass(frozen=True, slots=True)
class CloudReply:
    """A finished cloud answer, verbatim."""

    status: int
    body: bytes
    content_type: str


class Cloud(Protocol):
    """One managed OpenAI-compatible service. Errors are raised as :class:`CloudError`."""

    name: str

    async def create(self, endpoint: CloudEndpoint, body: Mapping[str, Any]) -> CloudReply:
        """Send one non-streamed request; ``body`` is the OpenAI request, model name included."""
        ...

    def stream(
        self, endpoint: CloudEndpoint, body: Mapping[str, Any]
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """A streamed request: entering sends it (raising on an error status); the iterator
        yields the server-sent-event bytes as they arrive."""
        ...

    async def close(self) -> None: ...
