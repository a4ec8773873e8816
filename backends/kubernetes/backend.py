"""``kind: kubernetes``: a Deployment scaled through its scale subresource, readiness from the
watched Deployment and its Service's EndpointSlices (docs/kubernetes.md).

``open`` lists before it returns, so the first observation is the cluster's truth and a
restarted warmgate adopts a running Deployment instead of restarting it. Watches then keep the
copy current; every change reaches the lifecycle at once (held requests are released on the
watch event, not by polling). Scale actions (``backends.kubernetes.scaling``) that meet an
unreachable API server are retried with backoff in the background while the observation says
what was asked, and ``degraded`` says why; refusals (RBAC, another owner of the replica count)
are :class:`BackendError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from backends.base import BackendError, Observation, ObservationListener, OutsideAutoscaler
from backends.documents import StateStore
from backends.kubernetes.api import (
    DEPLOYMENTS,
    HPAS,
    SCALED_OBJECTS,
    Forbidden,
    KubeApi,
    KubeError,
    NotFound,
    Unreachable,
)
from backends.kubernetes.informer import (
    DEFAULT_BACKOFF,
    WATCH_TIMEOUT,
    Backoff,
    Informer,
    service_slices,
)
from backends.kubernetes.observe import observe, other_owners
from backends.kubernetes.pods import PodWatch
from backends.kubernetes.scaling import ScaleActions, forbidden, where
from backends.kubernetes.state import DeploymentAnnotations
from backends.specs import KubernetesSpec

log = logging.getLogger("warmgate.kubernetes")

OPEN_TIMEOUT = 10.0
"""Seconds ``open`` waits for the first lists; past it warmgate starts degraded and keeps
trying in the background (an API server away must not keep warm targets from being served)."""


class KubernetesBackend:
    def __init__(
        self,
        target: str,
        spec: KubernetesSpec,
        *,
        connect: Callable[[], Awaitable[KubeApi]],
        backoff: Backoff = DEFAULT_BACKOFF,
        watch_timeout: int = WATCH_TIMEOUT,
        open_timeout: float = OPEN_TIMEOUT,
    ) -> None:
        self.target = target
        self.spec = spec
        self._connect = connect
        self._backoff = backoff
        self._watch_timeout = watch_timeout
        self._open_timeout = open_timeout
        self._where = where(spec)
        self._api: KubeApi | None = None
        self._deployments: Informer | None = None
        self._slices: Informer | None = None
        self._pods = PodWatch(
            target,
            spec.namespace,
            self._where,
            self._changed,
            backoff=backoff,
            watch_timeout=watch_timeout,
        )
        """The Deployment's pods, for the stage of a start."""
        self._owners_checked = False
        self._listener: ObservationListener | None = None
        self._observation = Observation()
        self._tasks: set[asyncio.Task[None]] = set()
        self._scaling = ScaleActions(
            target, spec, backoff=backoff, changed=self._changed, spawn=self._spawn
        )
        self._starting: str | None = None
        self.refused: str | None = None
        """Why warmgate may not scale this Deployment (found after start, e.g. an HPA)."""

    # -- the protocol ---------------------------------------------------------------------

    @property
    def always_on(self) -> bool:
        return False

    def observe(self) -> Observation:
        return self._observation

    @property
    def outside_autoscaler(self) -> OutsideAutoscaler | None:
        """``mode: keda``: KEDA owns the replicas, at ``target_concurrency`` per replica."""
        keda = self.spec.mode == "keda"
        return OutsideAutoscaler(self.spec.target_concurrency) if keda else None

    async def open(self, listener: ObservationListener) -> None:
        spec = self.spec
        self._listener = listener
        try:
            self._api = await self._connect()
        except KubeError as exc:
            raise BackendError(f"target {self.target!r}: {exc.message}") from exc
        self._deployments = Informer(
            self._api,
            DEPLOYMENTS,
            spec.namespace,
            self._changed,
            field_selector=f"metadata.name={spec.deployment}",
            backoff=self._backoff,
            watch_timeout=self._watch_timeout,
        )
        self._scaling.attach(self._api, self._deployments)
        try:
            async with asyncio.timeout(self._open_timeout):
                await self._bootstrap()
        except Forbidden as exc:
            await self._api.close()
            raise BackendError(self._forbidden(exc)) from exc
        except (Unreachable, TimeoutError) as exc:
            reason = exc.message if isinstance(exc, KubeError) else "no answer in time"
            self._starting = f"waiting for the API server {self._api.server}: {reason}"
            log.warning("[%s] %s; starting degraded", self.target, self._starting)
            self._changed()
            self._spawn(self._bootstrap_then_watch())
            return
        except KubeError as exc:
            await self._api.close()
            raise BackendError(f"target {self.target!r}: {exc.message}") from exc
        if self.refused:
            await self._api.close()
            raise BackendError(self.refused)
        self._start_watches()

    def state_store(self) -> StateStore:
        """The target's learned figures, as annotations on its Deployment (every warmgate
        replica and every restart shares them)."""
        return DeploymentAnnotations(
            self.spec.namespace, self.spec.deployment, lambda: self._api, self._deployment
        )

    async def scale_up(self) -> None:
        """``mode: keda``: nothing; KEDA scales the Deployment (warmgate is its scaler)."""
        if self.refused:
            raise BackendError(self.refused)
        if self.spec.mode == "direct":
            await self._scaling.scale(self.spec.max_replicas)

    async def scale_down(self, deadline: float | None = None) -> None:
        """Returns once the API server stored replicas 0 (or a retry is under way), not once
        the pods are gone: the Deployment finishes the stop on its own. Retried until it lands,
        or until ``deadline`` (loop time): then given up, and the Deployment is seen as it is
        (other warmgate replicas serve it again by then). ``mode: keda``: nothing."""
        if self.spec.mode == "direct":
            await self._scaling.scale(0, deadline)

    async def close(self) -> None:
        """Stops watching; never scales the shared Deployment (a restart must not flap it)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._api is not None:
            await self._api.close()
            self._api = None
            self._scaling.attach(None, None)

    # -- start ----------------------------------------------------------------------------

    async def _bootstrap(self) -> None:
        """Each step once: discovery, the other-owners check, the first lists."""
        api, spec = self._api, self.spec
        assert api is not None and self._deployments is not None
        if self._slices is None:
            self._slices = await service_slices(
                api,
                spec.namespace,
                spec.service_name,
                self._changed,
                backoff=self._backoff,
                watch_timeout=self._watch_timeout,
            )
        if not self._owners_checked and spec.mode == "direct":  # keda: KEDA owns replicas
            await self._check_owners(api)
        self._owners_checked = True
        if self._deployments.resource_version is None:
            await self._deployments.list_now()
        await self._pods.list_now(api, self._deployment())
        if self._slices.resource_version is None:  # last: ready endpoints with nothing stale
            await self._slices.list_now()
        self._starting = None
        self._changed()

    async def _check_owners(self, api: KubeApi) -> None:
        found: dict[str, list[dict[str, Any]]] = {}
        for name, resource in (("hpas", HPAS), ("scaled_objects", SCALED_OBJECTS)):
            try:
                found[name] = list((await api.list(resource, self.spec.namespace)).items)
            except NotFound:
                found[name] = []  # KEDA is not installed
            except Forbidden as exc:
                log.warning(
                    "[%s] cannot check whether something else scales %s (%s): %s",
                    self.target,
                    self._where,
                    resource,
                    exc.message,
                )
                found[name] = []
        owners = other_owners(self.spec, found["hpas"], found["scaled_objects"])
        if owners:
            self.refused = (
                f"target {self.target!r}: mode: direct refused: {', '.join(owners)} also "
                f"scales {self._where}; two owners of one replica count flap it. Remove it, "
                "or let one of them own the Deployment"
            )
            log.error("[%s] %s", self.target, self.refused)
            self._changed()

    async def _bootstrap_then_watch(self) -> None:
        failures = 0
        while True:
            try:
                await self._bootstrap()
                break
            except KubeError as exc:
                failures += 1
                problem = self._forbidden(exc) if isinstance(exc, Forbidden) else exc.message
                self._starting = f"waiting for the API server: {problem}"
                self._changed()
                await asyncio.sleep(self._backoff.delay(failures))
        log.info("[%s] API server reached: watching %s", self.target, self._where)
        self._start_watches()

    def _start_watches(self) -> None:
        assert self._deployments is not None and self._slices is not None
        self._spawn(self._deployments.run())
        self._spawn(self._slices.run())
        if self._pods.informer is not None:
            self._spawn(self._pods.informer.run())

    def _spawn(self, coro: Coroutine[None, None, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"kubernetes:{self.target}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _forbidden(self, exc: KubeError) -> str:
        return forbidden(self.target, self.spec, exc)

    # -- observation ----------------------------------------------------------------------

    def _deployment(self) -> dict[str, Any] | None:
        informer = self._deployments
        return None if informer is None else informer.objects.get(self.spec.deployment)

    def _problems(self) -> list[str]:
        problems = [p for p in (self._starting, self._scaling.pending) if p]
        for informer in (self._deployments, self._slices):
            if informer is not None and informer.problem:
                problems.append(informer.problem)
        if self._pods.problem:
            problems.append(self._pods.problem)
        informer = self._deployments
        if informer is not None and informer.resource_version and self._deployment() is None:
            problems.append(f"{self._where} not found")
        return problems

    def _watching(self) -> bool:
        informers = (self._deployments, self._slices)
        return self._starting is None and all(i is not None and not i.problem for i in informers)

    def _changed(self) -> None:
        if self._watching():
            self._scaling.reconnected()  # the API server is back: retry a pending action now
        deployment = self._deployment()
        self._scaling.settle(deployment)
        slices = self._slices.objects.values() if self._slices is not None else ()
        observation = observe(
            self.spec,
            deployment,
            slices,
            intent=self._scaling.intent,
            problems=self._problems(),
            refused=self.refused,
            pods=self._pods.pods(),
        )
        if observation != self._observation:
            self._observation = observation
            if self._listener is not None:
                self._listener(observation)
