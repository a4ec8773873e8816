"""Keeping a local copy of some objects current: list, then watch from the list's
resourceVersion, resume from the last version seen (bookmarks move it on while nothing
changes), list again on 410 Gone, and reconnect with backoff while the API server is away.

The copy is kept through outages: a target that was ready stays servable while the API server
is unreachable, and the first list after it returns replaces the copy whole, so nothing that
changed meanwhile is missed. Time is read through the event loop (tests fast-forward it).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from backends.kubernetes.api import (
    ENDPOINTSLICE_GROUP,
    Forbidden,
    Gone,
    Json,
    KubeApi,
    KubeError,
    ObjectList,
    Resource,
    WatchEvent,
    endpointslices,
)

log = logging.getLogger("warmgate.kubernetes")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Waits between retries against the API server: doubling, capped, with jitter so that
    several warmgate replicas do not come back in lockstep."""

    initial: float = 0.5
    """Seconds before the first retry: an API server restart takes a few seconds."""
    maximum: float = 10.0
    """Longest wait: the watches resume within this of the API server's return (a pending
    scale action is tried again as soon as a watch is back)."""
    jitter: float = 0.2
    """Up to this fraction is added at random."""

    def delay(self, failures: int) -> float:
        base = min(self.maximum, self.initial * 2.0 ** max(0, failures - 1))
        return base * (1.0 + self.jitter * random.random())


DEFAULT_BACKOFF = Backoff()

WATCH_TIMEOUT = 290
"""Seconds a watch runs before the server ends it and it is resumed (below the API server's
5-minute request limit, so the server ends it cleanly rather than the client)."""


def describe(exc: KubeError, resource: Resource, namespace: str) -> str:
    """An outage or refusal in words for /readyz and the log."""
    if isinstance(exc, Forbidden):
        return (
            f"forbidden to list/watch {resource} in namespace {namespace} "
            f"(check warmgate's Role): {exc.message}"
        )
    return f"cannot watch {resource} in namespace {namespace}: {exc.message}"


class Informer:
    """A local copy of the objects of one resource that match the selectors, by name."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        namespace: str,
        on_change: Callable[[], None],
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        watch_timeout: int = WATCH_TIMEOUT,
    ) -> None:
        self.api = api
        self.resource = resource
        self.namespace = namespace
        self.on_change = on_change
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.backoff = backoff
        self.watch_timeout = watch_timeout
        self.objects: dict[str, Json] = {}
        self.resource_version: str | None = None
        """Where the next watch resumes; ``None``: list first."""
        self.problem: str | None = None
        """Why the copy may be stale right now (the API server unreachable); ``None`` when the
        watch is connected."""
        self.lists = 0
        """Lists done so far (the first, and one per 410 Gone)."""

    async def list_now(self) -> None:
        """List and replace the copy whole; the next watch resumes from this list."""
        listed: ObjectList = await self.api.list(
            self.resource,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
        )
        objects = {str(o["metadata"]["name"]): o for o in listed.items}
        self.lists += 1
        self.resource_version = listed.resource_version
        self.problem = None
        self.objects = objects
        self.on_change()

    def _apply(self, event: WatchEvent) -> None:
        self.resource_version = event.resource_version or self.resource_version
        if event.type == "BOOKMARK":
            return
        name = str(event.object["metadata"]["name"])
        if event.type == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = event.object
        self.on_change()

    def _set_problem(self, problem: str | None) -> None:
        if problem != self.problem:
            self.problem = problem
            self.on_change()

    async def run(self) -> None:
        """Forever: (re)list when needed, watch, resume. Cancel to stop."""
        failures = 0
        while True:
            try:
                if self.resource_version is None:
                    await self.list_now()
                async with self.api.watch(
                    self.resource,
                    self.namespace,
                    resource_version=self.resource_version or "",
                    timeout_seconds=self.watch_timeout,
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                ) as events:
                    self._set_problem(None)
                    failures = 0
                    async for event in events:
                        self._apply(event)
            except Gone:
                log.info(
                    "%s in %s: resourceVersion too old; listing again",
                    self.resource,
                    self.namespace,
                )
                self.resource_version = None
            except KubeError as exc:
                failures += 1
                problem = describe(exc, self.resource, self.namespace)
                if failures == 1 or self.problem != problem:
                    log.warning("%s; retrying", problem)
                self._set_problem(problem)
                await asyncio.sleep(self.backoff.delay(failures))


async def service_slices(
    api: KubeApi,
    namespace: str,
    service: str,
    on_change: Callable[[], None],
    *,
    backoff: Backoff = DEFAULT_BACKOFF,
    watch_timeout: int = WATCH_TIMEOUT,
) -> Informer:
    """An informer on a Service's EndpointSlices, in the version the server serves (discovery
    is asked once, here)."""
    resource = endpointslices(await api.group_versions(ENDPOINTSLICE_GROUP))
    return Informer(
        api,
        resource,
        namespace,
        on_change,
        label_selector=f"kubernetes.io/service-name={service}",
        backoff=backoff,
        watch_timeout=watch_timeout,
    )
