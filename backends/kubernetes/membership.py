"""Several warmgate replicas: who the others are, and who leads (docs/replicas.md).

The others are the endpoints of warmgate's own headless Service, kept by an informer on its
EndpointSlices (listed ready or not: a replica that is starting or draining still counts).
Leadership is a ``coordination.k8s.io/v1`` Lease (``backends.kubernetes.lease``), renewed here
every ``renew_interval``; ``confirm`` renews right before an irreversible step.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine, Iterable

from backends.base import BackendError
from backends.documents import StateStore
from backends.kubernetes.api import Json, KubeApi, KubeError
from backends.kubernetes.informer import (
    DEFAULT_BACKOFF,
    WATCH_TIMEOUT,
    Backoff,
    Informer,
    service_slices,
)
from backends.kubernetes.lease import LeaseElection
from backends.kubernetes.state import ConfigMapStore
from backends.membership import Peer
from backends.specs import ReplicasSpec

log = logging.getLogger("warmgate.replicas")

OPEN_TIMEOUT = 10.0
"""Seconds ``open`` waits for the first list of peers and the first look at the Lease."""


def own_identity(spec: ReplicasSpec, pod_name: str | None = None) -> str:
    """``identity`` from the config, else ``pod_name`` (``$POD_NAME``, from the Downward API),
    else the host name (a pod's host name is its name)."""
    return spec.identity or pod_name or socket.gethostname()


def _url(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def peers_from_slices(
    slices: Iterable[Json], port: int | str, identity: str, own_address: str | None = None
) -> tuple[tuple[Peer, ...], list[str]]:
    """The replicas listed in warmgate's EndpointSlices, but this one, by name; and problems
    (a slice without the admin port). ``port``: the port's name, or the container port's
    number. Terminating or not ready: still listed (it may have work in flight)."""
    found: dict[str, Peer] = {}
    problems: list[str] = []
    for slice_ in slices:
        if slice_.get("addressType", "IPv4") not in ("IPv4", "IPv6"):
            continue
        ports = slice_.get("ports") or ()
        number = next(
            (
                int(p["port"])
                for p in ports
                if p.get("port") is not None
                and (p.get("name") == port if isinstance(port, str) else p.get("port") == port)
            ),
            None,
        )
        endpoints = slice_.get("endpoints") or ()
        if number is None:
            if endpoints:
                name = (slice_.get("metadata") or {}).get("name")
                problems.append(f"EndpointSlice {name} has no port {port!r}")
            continue
        for endpoint in endpoints:
            addresses = endpoint.get("addresses") or ()
            if not addresses:
                continue
            ref = endpoint.get("targetRef") or {}
            name = str(ref.get("name") or addresses[0])
            if name == identity or (own_address is not None and own_address in addresses):
                continue
            found[name] = Peer(name, _url(str(addresses[0]), number))
    return tuple(found[n] for n in sorted(found)), problems


class KubernetesMembership:
    def __init__(
        self,
        spec: ReplicasSpec,
        *,
        connect: Callable[[], Awaitable[KubeApi]],
        identity: str | None = None,
        own_address: str | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        watch_timeout: int = WATCH_TIMEOUT,
        open_timeout: float = OPEN_TIMEOUT,
        wall_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.spec = spec
        self._identity = identity or own_identity(spec)
        self._own_address = own_address
        self._connect = connect
        self._backoff = backoff
        self._watch_timeout = watch_timeout
        self._open_timeout = open_timeout
        self._lease = LeaseElection(spec, self._identity, wall_clock)
        self._api: KubeApi | None = None
        self._slices: Informer | None = None
        self._on_change: Callable[[], None] = lambda: None
        self._peers: tuple[Peer, ...] = ()
        self._slice_problems: list[str] = []
        self._lease_problem: str | None = "the leader Lease has not been read yet"
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._was_leading = False

    # -- the protocol ---------------------------------------------------------------------

    @property
    def identity(self) -> str:
        return self._identity

    def state_store(self) -> StateStore:
        """The replicas' documents (each one's cloud spend today), in the ConfigMap
        ``warmgate-state`` of warmgate's namespace."""
        return ConfigMapStore(self.spec.namespace, lambda: self._api)

    def peers(self) -> tuple[Peer, ...]:
        return self._peers

    def leading(self) -> bool:
        return self._lease.leading()

    @property
    def holder(self) -> str | None:
        """Who holds the Lease, as last read."""
        return self._lease.holder

    def problems(self) -> list[str]:
        problems = list(self._slice_problems)
        if self._slices is not None and self._slices.problem:
            problems.append(self._slices.problem)
        if self._lease_problem:
            problems.append(self._lease_problem)
        return problems

    async def open(self, on_change: Callable[[], None]) -> None:
        self._on_change = on_change
        try:
            self._api = await self._connect()
        except KubeError as exc:
            raise BackendError(f"replicas: {exc.message}") from exc
        try:  # what fails here is retried in the background
            async with asyncio.timeout(self._open_timeout):
                await self._bootstrap()
        except KubeError as exc:
            self._lease_problem = f"replicas: {exc.message}"
        except TimeoutError:
            self._lease_problem = "replicas: the API server did not answer in time"
        self._spawn(self._run())
        log.info(
            "replica %s: peers %s; leader %s",
            self._identity,
            ", ".join(p.name for p in self._peers) or "none",
            self.holder or "none",
        )

    async def _bootstrap(self) -> None:
        """Each step once: discovery, the first list of the others, a first look at the Lease."""
        api, spec = self._api, self.spec
        assert api is not None
        if self._slices is None:
            self._slices = await service_slices(
                api,
                spec.namespace,
                spec.service,
                self._slices_changed,
                backoff=self._backoff,
                watch_timeout=self._watch_timeout,
            )
        await self._elect_once()
        if self._slices.resource_version is None:
            await self._slices.list_now()

    async def _run(self) -> None:
        failures = 0
        while self._slices is None:  # the API server was away at start
            try:
                await self._bootstrap()
            except KubeError as exc:
                failures += 1
                self._lease_problem = f"replicas: {exc.message}"
                await asyncio.sleep(self._backoff.delay(failures))
        self._spawn(self._slices.run())  # lists first if the first list failed
        await self._elect()

    async def confirm(self) -> bool:
        await self._elect_once()
        return self.leading()

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._api is None:
            return
        if self.leading():
            with contextlib.suppress(KubeError, TimeoutError):
                async with asyncio.timeout(2.0):
                    await self._lease.release(self._api)
        await self._api.close()
        self._api = None

    # -- peers ----------------------------------------------------------------------------

    def _slices_changed(self) -> None:
        slices = self._slices.objects.values() if self._slices is not None else ()
        peers, self._slice_problems = peers_from_slices(
            slices, self.spec.port, self._identity, self._own_address
        )
        if peers != self._peers:
            self._peers = peers
            log.info("replicas: peers now %s", ", ".join(p.name for p in peers) or "none")
        self._on_change()

    # -- the Lease ------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro, name="replicas")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _elect(self) -> None:
        """Forever: renew while leading, else look whether the Lease may be taken."""
        while True:
            await asyncio.sleep(self.spec.renew_interval)
            await self._elect_once()

    async def _elect_once(self) -> None:
        async with self._lock:
            try:
                assert self._api is not None
                await self._lease.try_acquire_or_renew(self._api)
                self._lease_problem = None
            except KubeError as exc:
                problem = f"leader Lease {self.spec.namespace}/{self.spec.lease}: {exc.message}"
                if problem != self._lease_problem:
                    log.warning("%s", problem)
                self._lease_problem = problem
            self._report_change()

    def _report_change(self) -> None:
        leading = self.leading()
        if leading != self._was_leading:
            self._was_leading = leading
            log.info(
                "replica %s %s the leadership (Lease %s/%s)",
                self._identity,
                "took" if leading else "lost",
                self.spec.namespace,
                self.spec.lease,
            )
            self._on_change()
