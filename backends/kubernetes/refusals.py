"""Telling a restarting API server's refusals from RBAC's.

An API server that has just started may answer 401/403 for a moment before its authenticators
and authorizer have their caches (current Kubernetes does, for tens of milliseconds, before
/readyz is ready; 1.20 refused the connection instead). Taken at its word, such a refusal reads
as a missing Role: a scale-up fails and the held request with it. So a 401/403 is transient
(:class:`Unreachable`, retried with backoff) when it comes within :data:`RESTART_WINDOW` of the
first answer after the connection was lost, or while /readyz is not ready; only a steady one,
from a ready server that has been answering a while, is :class:`Forbidden`.

:class:`SteadyRefusals` wraps any :class:`KubeApi` to do that; :func:`transient` is the rule.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from backends.kubernetes.api import (
    Forbidden,
    Json,
    KubeApi,
    KubeError,
    ObjectList,
    Resource,
    Unreachable,
    WatchEvent,
)

RESTART_WINDOW = 10.0
"""Seconds after the first answer that follows a lost connection during which a 401/403 is
taken for the API server still starting: far above the moment it takes (tens of ms), so a
loaded node does not turn it into a missing Role; a real missing Role is reported that much
later after an outage, and at once otherwise."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Connection:
    """What the refusal rule needs to know of the connection, in loop time."""

    lost_at: float | None = None
    """When a request last found the API server away (None: never since start)."""
    answered_at: float | None = None
    """When the first answer after that loss came (None: none yet)."""


def transient(connection: Connection, now: float, *, window: float = RESTART_WINDOW) -> bool:
    """Whether a 401/403 at ``now`` is the API server coming back rather than RBAC, before
    asking /readyz: within ``window`` of the first answer after a lost connection."""
    if connection.lost_at is None:
        return False
    answered = connection.answered_at
    return answered is None or now - answered <= window


class SteadyRefusals:
    """A :class:`KubeApi` whose 401/403 answers are :class:`Forbidden` only when steady (see
    the module docstring); ``ready`` asks the API server's /readyz (False: not ready, or no
    answer)."""

    def __init__(
        self, api: KubeApi, ready: Callable[[], Awaitable[bool]], *, window: float = RESTART_WINDOW
    ) -> None:
        self._api = api
        self._ready = ready
        self._window = window
        self._connection = Connection()

    @property
    def server(self) -> str:
        return self._api.server

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _lost(self) -> None:
        self._connection = Connection(lost_at=self._now())

    def _answered(self) -> None:
        c = self._connection
        if c.lost_at is not None and c.answered_at is None:
            self._connection = Connection(c.lost_at, self._now())

    async def _judge(self, exc: Forbidden) -> KubeError:
        """The error a 401/403 stands for."""
        self._answered()
        why = None
        if transient(self._connection, self._now(), window=self._window):
            why = "just after the connection to the API server was lost"
        elif not await self._ready():
            why = "while the API server's /readyz is not ready"
        if why is None:
            return exc
        # warmgate's words first: the server's, after them, are what a bounded line cuts
        return Unreachable(f"the API server is starting ({why}): {exc.message}", status=exc.status)

    async def _guard(self, call: Awaitable[T]) -> T:
        try:
            result = await call
        except Unreachable:
            self._lost()
            raise
        except Forbidden as exc:
            raise await self._judge(exc) from exc
        except KubeError:
            self._answered()
            raise
        self._answered()
        return result

    async def group_versions(self, group: str) -> tuple[str, ...]:
        return await self._guard(self._api.group_versions(group))

    async def list(
        self,
        resource: Resource,
        namespace: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        return await self._guard(
            self._api.list(
                resource, namespace, label_selector=label_selector, field_selector=field_selector
            )
        )

    def watch(
        self,
        resource: Resource,
        namespace: str,
        *,
        resource_version: str,
        timeout_seconds: int,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        opened = self._api.watch(
            resource,
            namespace,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            label_selector=label_selector,
            field_selector=field_selector,
        )
        return self._watching(opened)

    @asynccontextmanager
    async def _watching(
        self, opened: AbstractAsyncContextManager[AsyncIterator[WatchEvent]]
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        events = await self._guard(opened.__aenter__())
        try:
            yield self._events(events)
        except BaseException as exc:
            if not await opened.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await opened.__aexit__(None, None, None)

    async def _events(self, events: AsyncIterator[WatchEvent]) -> AsyncIterator[WatchEvent]:
        while True:
            try:
                event = await self._guard(anext(events))
            except StopAsyncIteration:
                return
            yield event

    async def get(self, resource: Resource, namespace: str, name: str) -> Json:
        return await self._guard(self._api.get(resource, namespace, name))

    async def create(self, resource: Resource, namespace: str, body: Json) -> Json:
        return await self._guard(self._api.create(resource, namespace, body))

    async def replace(self, resource: Resource, namespace: str, body: Json) -> Json:
        return await self._guard(self._api.replace(resource, namespace, body))

    async def patch(self, resource: Resource, namespace: str, name: str, body: Json) -> Json:
        return await self._guard(self._api.patch(resource, namespace, name, body))

    async def get_scale(self, namespace: str, deployment: str) -> int:
        return await self._guard(self._api.get_scale(namespace, deployment))

    async def patch_scale(self, namespace: str, deployment: str, replicas: int) -> int:
        return await self._guard(self._api.patch_scale(namespace, deployment, replicas))

    async def close(self) -> None:
        await self._api.close()
