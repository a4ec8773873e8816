"""An in-memory twin of :class:`backends.kubernetes.api.KubeApi` for the backend's fast tests.

It keeps objects with resourceVersions, serves lists and watches (resume from a version,
bookmarks before a watch ends, 410 Gone for a version older than its history), and plays the
controllers the backend relies on: a Deployment scaled above 0 gets pods that turn ready after
``pod_ready_after`` seconds of loop time, listed in its Service's EndpointSlice. Outages,
restarts and RBAC refusals are switches. ``tests/kube/test_contract.py`` runs the same suite
against this fake and the real API server, so the two cannot drift apart.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from backends.kubernetes.api import (
    DEPLOYMENTS,
    ENDPOINTSLICE_GROUP,
    HPAS,
    Conflict,
    Forbidden,
    Gone,
    Json,
    NotFound,
    ObjectList,
    Resource,
    Unreachable,
    WatchEvent,
)

_Key = tuple[str, str, str]  # (resource path, namespace, name)


def _path(resource: Resource) -> str:
    return f"{resource.group}/{resource.plural}"


@dataclass
class _Watcher:
    path: str
    namespace: str
    label_selector: str | None
    field_selector: str | None
    queue: asyncio.Queue[WatchEvent | Exception] = field(default_factory=asyncio.Queue)


@dataclass
class _Pod:
    name: str
    address: str
    ready: bool = False
    timer: asyncio.TimerHandle | None = None


def _matches(obj: Json, label_selector: str | None, field_selector: str | None) -> bool:
    meta = obj.get("metadata") or {}
    for selector, values in (
        (label_selector, meta.get("labels") or {}),
        (field_selector, {"metadata.name": meta.get("name")}),
    ):
        for term in (selector or "").split(","):
            if term:
                key, _, want = term.partition("=")
                if values.get(key) != want:
                    return False
    return True


class FakeCluster:
    """The shared state; :meth:`client` hands out KubeApi twins that see it."""

    def __init__(
        self, endpointslice_versions: tuple[str, ...] = ("v1",), pod_ready_after: float = 0.05
    ) -> None:
        self.endpointslice_versions = endpointslice_versions
        self.pod_ready_after = pod_ready_after
        self.reachable = True
        self.installed = {"", "apps", "autoscaling", "coordination.k8s.io", ENDPOINTSLICE_GROUP}
        """API groups served ("": the core group; add "keda.sh" to serve ScaledObjects)."""
        self._rv = 100
        self._oldest = 100
        self._objects: dict[_Key, Json] = {}
        self._history: list[tuple[int, _Key, WatchEvent]] = []
        self._watchers: list[_Watcher] = []
        self._pods: dict[tuple[str, str], list[_Pod]] = {}  # (namespace, deployment)
        self._services: dict[tuple[str, str], str] = {}
        self._addresses = itertools.count(2)
        self.calls: list[str] = []
        """Every request, as ``verb plural`` (``patch deployments/scale``), for assertions."""

    # -- clients --------------------------------------------------------------------------

    def client(self, allowed: set[str] | None = None) -> FakeKube:
        """A client; ``allowed``: the ``verb plural`` pairs its RBAC grants (None: all)."""
        return FakeKube(self, allowed)

    # -- what an admin (or a controller) does --------------------------------------------

    @property
    def slices(self) -> Resource:
        return Resource(ENDPOINTSLICE_GROUP, self.endpointslice_versions[0], "endpointslices")

    def create_deployment(
        self, namespace: str, name: str, replicas: int = 0, *, service: str | None = None
    ) -> None:
        """A Deployment and the Service selecting its pods (named ``service`` or like it)."""
        labels = {"app": name}
        self._store(
            "ADDED",
            DEPLOYMENTS,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": namespace, "generation": 1},
                "spec": {"replicas": replicas, "selector": {"matchLabels": labels}},
                "status": {"observedGeneration": 1},
            },
        )
        svc = service or name
        self._store(
            "ADDED",
            self.slices,
            {
                "apiVersion": self.slices.api_version,
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{svc}-x7k2p",
                    "namespace": namespace,
                    "labels": {"kubernetes.io/service-name": svc},
                },
                "addressType": "IPv4",
                "endpoints": [],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            },
        )
        self._pods[(namespace, name)] = []
        self._services[(namespace, name)] = svc
        if replicas:
            self._reconcile(namespace, name)

    def create_hpa(self, namespace: str, name: str, deployment: str) -> None:
        self._store(
            "ADDED",
            HPAS,
            {
                "apiVersion": "autoscaling/v1",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "scaleTargetRef": {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": deployment,
                    },
                    "maxReplicas": 2,
                },
            },
        )

    def create_scaled_object(self, namespace: str, name: str, deployment: str) -> None:
        self.installed.add("keda.sh")
        self._store(
            "ADDED",
            Resource("keda.sh", "v1alpha1", "scaledobjects"),
            {
                "apiVersion": "keda.sh/v1alpha1",
                "kind": "ScaledObject",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"scaleTargetRef": {"name": deployment}},
            },
        )

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        """What ``kubectl scale`` does."""
        deployment = self._objects[(_path(DEPLOYMENTS), namespace, name)]
        changed = copy.deepcopy(deployment)
        changed["spec"]["replicas"] = replicas
        changed["metadata"]["generation"] += 1
        self._store("MODIFIED", DEPLOYMENTS, changed)
        self._reconcile(namespace, name)

    def delete_pod(self, namespace: str, deployment: str, index: int = 0) -> str:
        """One pod goes away (its address leaves the EndpointSlice); the Deployment makes a
        new one, ready after ``pod_ready_after``. Returns the gone pod's address."""
        pods = self._pods[(namespace, deployment)]
        gone = pods.pop(index)
        if gone.timer:
            gone.timer.cancel()
        self._reconcile(namespace, deployment)
        return gone.address

    def ready_addresses(self, namespace: str, deployment: str) -> list[str]:
        return [p.address for p in self._pods[(namespace, deployment)] if p.ready]

    def replicas(self, namespace: str, name: str) -> int:
        spec = self._objects[(_path(DEPLOYMENTS), namespace, name)]["spec"]
        return int(spec.get("replicas") or 0)

    def go_down(self) -> None:
        """The API server stops answering; open watches break."""
        self.reachable = False
        self._break_watches(Unreachable("connection reset by peer"))

    def come_back(self, restarted: bool = True) -> None:
        """Answering again; a restarted server has no history to resume watches from."""
        self.reachable = True
        if restarted:  # a new watch cache, starting after the API server's own first writes
            self._rv += 1
            self._oldest = self._rv
            self._history.clear()

    def _break_watches(self, exc: Exception) -> None:
        for watcher in self._watchers:
            watcher.queue.put_nowait(exc)

    # -- the simulated controllers ----------------------------------------------------------

    def _reconcile(self, namespace: str, name: str) -> None:
        want = self.replicas(namespace, name)
        pods = self._pods[(namespace, name)]
        while len(pods) > want:
            gone = pods.pop()
            if gone.timer:
                gone.timer.cancel()
        loop = asyncio.get_running_loop()
        while len(pods) < want:
            n = next(self._addresses)
            pod = _Pod(f"{name}-{n}", f"10.244.{n >> 8}.{n & 255}")
            pod.timer = loop.call_later(self.pod_ready_after, self._pod_ready, namespace, name, pod)
            pods.append(pod)
        self._publish_pods(namespace, name)

    def _pod_ready(self, namespace: str, name: str, pod: _Pod) -> None:
        pod.ready, pod.timer = True, None
        self._publish_pods(namespace, name)

    def _publish_pods(self, namespace: str, name: str) -> None:
        pods = self._pods[(namespace, name)]
        svc = self._services[(namespace, name)]
        slice_ = self._objects[(_path(self.slices), namespace, f"{svc}-x7k2p")]
        endpoints = [
            {
                "addresses": [p.address],
                "conditions": {"ready": p.ready},
                "targetRef": {"kind": "Pod", "name": p.name, "namespace": namespace},
            }
            for p in pods
        ]
        if endpoints != slice_["endpoints"]:
            self._store("MODIFIED", self.slices, {**copy.deepcopy(slice_), "endpoints": endpoints})
        deployment = copy.deepcopy(self._objects[(_path(DEPLOYMENTS), namespace, name)])
        ready = sum(p.ready for p in pods)
        status = {
            "observedGeneration": deployment["metadata"]["generation"],
            **({"replicas": len(pods)} if pods else {}),
            **({"readyReplicas": ready} if ready else {}),
        }
        if status != deployment["status"]:
            deployment["status"] = status
            self._store("MODIFIED", DEPLOYMENTS, deployment)

    # -- storage --------------------------------------------------------------------------

    def _store(self, kind: str, resource: Resource, obj: Json) -> Json:
        self._rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._rv)
        key = (_path(resource), obj["metadata"]["namespace"], obj["metadata"]["name"])
        self._objects[key] = obj
        event = WatchEvent(kind, copy.deepcopy(obj))  # type: ignore[arg-type]
        self._history.append((self._rv, key, event))
        for watcher in self._watchers:
            if (watcher.path, watcher.namespace) == key[:2] and _matches(
                obj, watcher.label_selector, watcher.field_selector
            ):
                watcher.queue.put_nowait(event)
        return obj

    # -- the API, as a client sees it -------------------------------------------------------

    def _check(self, verb: str, what: str, allowed: set[str] | None, namespace: str) -> None:
        self.calls.append(f"{verb} {what}")
        if not self.reachable:
            raise Unreachable(f"{verb} {what}: API server unreachable: connection refused")
        if allowed is not None and f"{verb} {what}" not in allowed:
            raise Forbidden(
                f'{what} is forbidden: User "fake" cannot {verb} resource "{what}" '
                f'in the namespace "{namespace}"',
                status=403,
            )

    def _served(self, resource: Resource) -> None:
        if resource.group not in self.installed:
            raise NotFound(f"the server could not find the requested resource ({resource})")
        if resource.group == ENDPOINTSLICE_GROUP and (
            resource.version not in self.endpointslice_versions
        ):
            raise NotFound(f"the server could not find the requested resource ({resource})")

    def _list(
        self, resource: Resource, namespace: str, labels: str | None, fields: str | None
    ) -> ObjectList:
        self._served(resource)
        items = tuple(
            copy.deepcopy(obj)
            for (path, ns, _), obj in sorted(self._objects.items())
            if path == _path(resource) and ns == namespace and _matches(obj, labels, fields)
        )
        return ObjectList(items, str(self._rv))

    async def _watch(
        self,
        resource: Resource,
        namespace: str,
        resource_version: str,
        seconds: float,
        labels: str | None,
        fields: str | None,
    ) -> AsyncIterator[WatchEvent]:
        watcher = _Watcher(_path(resource), namespace, labels, fields)
        start = int(resource_version or self._rv)
        if start < self._oldest:
            raise Gone(f"too old resource version: {start} ({self._oldest})", status=410)
        for rv, key, event in self._history:
            matches = _matches(event.object, labels, fields)
            if rv > start and key[:2] == (watcher.path, namespace) and matches:
                watcher.queue.put_nowait(event)
        self._watchers.append(watcher)
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        bookmark_at = end - min(2.0, seconds / 2)
        try:
            while True:
                now = loop.time()
                if now >= end:
                    return
                wait = (bookmark_at if bookmark_at > now else end) - now
                try:
                    async with asyncio.timeout(wait):
                        item = await watcher.queue.get()
                except TimeoutError:
                    if bookmark_at <= loop.time() < end and bookmark_at > 0:
                        bookmark_at = 0
                        meta = {"resourceVersion": str(self._rv)}
                        yield WatchEvent("BOOKMARK", {"kind": "Bookmark", "metadata": meta})
                    continue
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self._watchers.remove(watcher)


class FakeKube:
    """One client of a :class:`FakeCluster`, with its own RBAC."""

    def __init__(self, cluster: FakeCluster, allowed: set[str] | None) -> None:
        self.cluster = cluster
        self.allowed = allowed
        self.closed = False

    @property
    def server(self) -> str:
        return "https://fake-apiserver:6443"

    async def group_versions(self, group: str) -> tuple[str, ...]:
        c = self.cluster
        if not c.reachable:
            raise Unreachable("discovery: API server unreachable: connection refused")
        if group == ENDPOINTSLICE_GROUP:
            return c.endpointslice_versions
        return ("v1",) if group in c.installed else ()

    async def list(
        self,
        resource: Resource,
        namespace: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        await asyncio.sleep(0)
        self.cluster._check("list", resource.plural, self.allowed, namespace)
        return self.cluster._list(resource, namespace, label_selector, field_selector)

    @asynccontextmanager
    async def watch(
        self,
        resource: Resource,
        namespace: str,
        *,
        resource_version: str,
        timeout_seconds: int,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        await asyncio.sleep(0)
        self.cluster._check("watch", resource.plural, self.allowed, namespace)
        self.cluster._served(resource)
        events = self.cluster._watch(
            resource, namespace, resource_version, timeout_seconds, label_selector, field_selector
        )
        try:
            yield events
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    def _deployment(self, namespace: str, name: str) -> Json:
        obj = self.cluster._objects.get((_path(DEPLOYMENTS), namespace, name))
        if obj is None:
            raise NotFound(f'deployments.apps "{name}" not found', status=404)
        return obj

    async def get(self, resource: Resource, namespace: str, name: str) -> Json:
        await asyncio.sleep(0)
        self.cluster._check("get", resource.plural, self.allowed, namespace)
        self.cluster._served(resource)
        obj = self.cluster._objects.get((_path(resource), namespace, name))
        if obj is None:
            raise NotFound(f'{resource} "{name}" not found', status=404)
        return copy.deepcopy(obj)

    async def create(self, resource: Resource, namespace: str, body: Json) -> Json:
        await asyncio.sleep(0)
        self.cluster._check("create", resource.plural, self.allowed, namespace)
        self.cluster._served(resource)
        name = body["metadata"]["name"]
        if (_path(resource), namespace, name) in self.cluster._objects:
            raise Conflict(f'{resource} "{name}" already exists', status=409)
        obj = copy.deepcopy(body)
        obj["metadata"]["namespace"] = namespace
        return copy.deepcopy(self.cluster._store("ADDED", resource, obj))

    async def replace(self, resource: Resource, namespace: str, body: Json) -> Json:
        await asyncio.sleep(0)
        self.cluster._check("update", resource.plural, self.allowed, namespace)
        self.cluster._served(resource)
        name = body["metadata"]["name"]
        current = self.cluster._objects.get((_path(resource), namespace, name))
        if current is None:
            raise NotFound(f'{resource} "{name}" not found', status=404)
        version = body["metadata"].get("resourceVersion")
        if version and version != current["metadata"]["resourceVersion"]:
            raise Conflict(
                f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                status=409,
            )
        obj = copy.deepcopy(body)
        obj["metadata"]["namespace"] = namespace
        return copy.deepcopy(self.cluster._store("MODIFIED", resource, obj))

    async def patch(self, resource: Resource, namespace: str, name: str, body: Json) -> Json:
        await asyncio.sleep(0)
        self.cluster._check("patch", resource.plural, self.allowed, namespace)
        self.cluster._served(resource)
        current = self.cluster._objects.get((_path(resource), namespace, name))
        if current is None:
            raise NotFound(f'{resource} "{name}" not found', status=404)
        obj = merge_patch(copy.deepcopy(current), body)
        obj["metadata"].update(name=name, namespace=namespace)
        if resource == DEPLOYMENTS and (
            obj.get("spec") != current.get("spec")
            or obj["metadata"].get("annotations") != current["metadata"].get("annotations")
        ):  # as the API server counts generations of a Deployment
            obj["metadata"]["generation"] = current["metadata"].get("generation", 0) + 1
        return copy.deepcopy(self.cluster._store("MODIFIED", resource, obj))

    async def get_scale(self, namespace: str, deployment: str) -> int:
        await asyncio.sleep(0)
        self.cluster._check("get", "deployments/scale", self.allowed, namespace)
        return int(self._deployment(namespace, deployment)["spec"].get("replicas") or 0)

    async def patch_scale(self, namespace: str, deployment: str, replicas: int) -> int:
        await asyncio.sleep(0)
        self.cluster._check("patch", "deployments/scale", self.allowed, namespace)
        self._deployment(namespace, deployment)
        if self.cluster.replicas(namespace, deployment) != replicas:
            self.cluster.scale(namespace, deployment, replicas)
        return replicas

    async def close(self) -> None:
        self.closed = True


def merge_patch(target: Json, patch: Json) -> Json:
    """RFC 7386, as the API server applies ``application/merge-patch+json``."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def everything_but(*denied: str) -> set[str]:
    """An RBAC grant of every verb the backend uses except ``denied``."""
    verbs = {
        "list deployments",
        "watch deployments",
        "list endpointslices",
        "watch endpointslices",
        "get deployments/scale",
        "patch deployments/scale",
        "list horizontalpodautoscalers",
        "list scaledobjects",
        "list pods",
        "watch pods",
        "patch deployments",
    }
    return verbs - set(denied)
