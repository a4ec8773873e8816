"""Scale actions on one Deployment through its scale subresource (``mode: direct``).

The replica count asked for is the *intent* until the watched Deployment shows it (or a later
list is made). An API server that cannot be reached is retried with backoff in the background,
at once when a watch connects again; a stop with a deadline that cannot be stored by then is
given up (the Deployment is then seen as it is). Refusals are :class:`BackendError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from backends.base import BackendError
from backends.kubernetes.api import Forbidden, KubeApi, KubeError, Unreachable
from backends.kubernetes.informer import Backoff, Informer
from backends.kubernetes.observe import spec_replicas
from backends.specs import KubernetesSpec

log = logging.getLogger("warmgate.kubernetes")

SCALE_UP_RETRY = 1.0
"""Longest wait between tries of a pending scale-up: a person waits for it, and it is one
small request. Waiting for a watch to connect again is not enough: after a long outage the
watches' own backoff reaches its cap (10 s and jitter), and a try that fails just as the API
server returns waited that long again (a scale-up stored ~20 s after the API server answered)."""


def where(spec: KubernetesSpec) -> str:
    """How messages name the Deployment."""
    return f"deployment {spec.namespace}/{spec.deployment}"


def forbidden(target: str, spec: KubernetesSpec, exc: KubeError) -> str:
    """The message of a refusal by RBAC, naming the Role to grant."""
    return (
        f"target {target!r}: the API server refused warmgate's credentials for "
        f"{where(spec)}: {exc.message}. Grant the Role in deploy/base/router/rbac.yaml "
        f"in namespace {spec.namespace} (docs/kubernetes.md)"
    )


class ScaleActions:
    """The intent, its store and its retries. ``changed`` is called whenever the intent or
    ``pending`` changes; ``spawn`` runs a retry as one of the backend's tasks."""

    def __init__(
        self,
        target: str,
        spec: KubernetesSpec,
        *,
        backoff: Backoff,
        changed: Callable[[], None],
        spawn: Callable[[Coroutine[None, None, None]], asyncio.Task[None]],
    ) -> None:
        self.target = target
        self.spec = spec
        self._where = where(spec)
        self._backoff = backoff
        self._changed = changed
        self._spawn = spawn
        self._api: KubeApi | None = None
        self._deployments: Informer | None = None
        self._lock = asyncio.Lock()
        self._retry: asyncio.Task[None] | None = None
        self._reconnected = asyncio.Event()
        """Set when a watch is connected again: a pending scale action is retried at once."""
        self._intent: int | None = None
        self._asked_at_list: int | None = None
        """Set once the intent is stored in the cluster: the deployment informer's list count
        then (a later list is authoritative and confirms it too)."""
        self._pending: str | None = None

    @property
    def intent(self) -> int | None:
        """Replicas asked for and not yet seen in the watched Deployment."""
        return self._intent

    @property
    def pending(self) -> str | None:
        """Why an asked scale is not stored yet (it is being retried)."""
        return self._pending

    def attach(self, api: KubeApi | None, deployments: Informer | None) -> None:
        """The API and the Deployment's informer to act through; ``None``: not connected."""
        self._api, self._deployments = api, deployments

    def reconnected(self) -> None:
        """The watches are connected again: a pending action is retried now."""
        if self._pending:
            self._reconnected.set()

    def settle(self, deployment: dict[str, Any] | None) -> None:
        """Forget the intent once the watched Deployment shows it (or a later list was made)."""
        asked, informer = self._asked_at_list, self._deployments
        if self._intent is None or asked is None or informer is None:
            return
        watched = spec_replicas(deployment)
        shown = deployment is not None and (watched > 0) == (self._intent > 0)
        if shown or informer.lists > asked:
            self._intent = self._asked_at_list = None

    async def scale(self, replicas: int, deadline: float | None = None) -> None:
        async with self._lock:
            if self._retry is not None:
                self._retry.cancel()
                self._retry = None
            self._intent, self._asked_at_list, self._pending = replicas, None, None
            self._changed()
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._ask(replicas)
            except TimeoutError:
                self._give_up(replicas, "no answer before the deadline")
            except Unreachable as exc:
                self._retry_later(replicas, exc, deadline)
            except KubeError as exc:
                if replicas == 0 and (deadline is None or loop.time() < deadline):
                    self._retry_later(replicas, exc, deadline)  # a stop is retried until it lands
                    return
                if replicas == 0:
                    self._give_up(replicas, exc.message)
                    return
                self._intent = None
                self._changed()
                message = (
                    forbidden(self.target, self.spec, exc)
                    if isinstance(exc, Forbidden)
                    else f"target {self.target!r}: cannot scale {self._where}: {exc.message}"
                )
                raise BackendError(message) from exc

    async def _ask(self, replicas: int) -> None:
        """One try at storing the intent (the lock is held)."""
        api, informer = self._api, self._deployments
        if api is None or informer is None:
            raise Unreachable("not connected")
        if replicas > 0:
            current = await api.get_scale(self.spec.namespace, self.spec.deployment)
            if current < 1:
                await api.patch_scale(self.spec.namespace, self.spec.deployment, replicas)
                log.info("[%s] scaled %s to %d", self.target, self._where, replicas)
        else:
            await api.patch_scale(self.spec.namespace, self.spec.deployment, 0)
            log.info("[%s] scaled %s to 0", self.target, self._where)
        self._asked_at_list = informer.lists
        self._pending = None
        self._changed()

    def _retry_later(self, replicas: int, exc: KubeError, deadline: float | None = None) -> None:
        self._pending = f"scale to {replicas} pending, retrying: {exc.message}"
        log.warning("[%s] %s", self.target, self._pending)
        self._changed()
        self._retry = self._spawn(self._retry_loop(replicas, deadline))

    def _give_up(self, replicas: int, why: str) -> None:
        """A stop with a deadline that could not be stored in time: forget it (the lock is
        held); the Deployment is then seen as the watch shows it."""
        log.warning("[%s] scale to %d given up at its deadline: %s", self.target, replicas, why)
        self._intent = self._asked_at_list = self._pending = None
        self._retry = None
        self._changed()

    async def _retry_loop(self, replicas: int, deadline: float | None = None) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            if deadline is not None and loop.time() >= deadline:
                async with self._lock:
                    if self._intent == replicas:
                        self._give_up(replicas, self._pending or "not stored")
                return
            failures += 1
            self._reconnected.clear()
            wait = self._backoff.delay(failures)
            if replicas > 0:
                wait = min(wait, SCALE_UP_RETRY)
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - loop.time()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._reconnected.wait()
            async with self._lock:
                if self._intent != replicas:
                    return
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._ask(replicas)
                except TimeoutError:
                    self._give_up(replicas, "no answer before the deadline")
                    return
                except KubeError as exc:
                    self._pending = f"scale to {replicas} pending, retrying: {exc.message}"
                    self._changed()
                    continue
                self._retry = None
                return
