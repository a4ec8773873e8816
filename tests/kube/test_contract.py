"""One contract suite for both implementations of ``KubeApi``: the in-memory fake the backend's
fast tests use (tests/kube/fake.py) and ``RealKube`` against the real API server. What the
backend relies on is asserted here, so the fake cannot drift from the real thing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
from kubernetes_asyncio import client

from backends.kubernetes.api import (
    CONFIGMAPS,
    DEPLOYMENTS,
    ENDPOINTSLICE_GROUP,
    HPAS,
    LEASES,
    PODS,
    SCALED_OBJECTS,
    Conflict,
    Forbidden,
    Gone,
    KubeApi,
    KubeError,
    NotFound,
    Unreachable,
    WatchEvent,
    endpointslices,
)
from backends.kubernetes.client import Access, connect
from backends.kubernetes.observe import ready_addresses

from .cluster import KubeCluster, free_port, kubeconfig_dict
from .fake import FakeCluster
from .workloads import engine_deployment, engine_service


class Driver(Protocol):
    """What a contract test does to the cluster as its admin; ``api`` is the client under test."""

    api: KubeApi
    namespace: str
    within: float
    """Seconds a controller may take to react (real pods start in about a second)."""

    async def deployment(self, name: str) -> None: ...
    async def restart(self) -> None: ...
    async def forbidden_api(self) -> KubeApi: ...
    async def unreachable_api(self) -> KubeApi: ...


@dataclass
class FakeDriver:
    cluster: FakeCluster
    api: KubeApi
    namespace: str = "render"
    within: float = 5.0

    async def deployment(self, name: str) -> None:
        self.cluster.create_deployment(self.namespace, name)

    async def restart(self) -> None:
        self.cluster.go_down()
        await asyncio.sleep(0.5)
        self.cluster.come_back(restarted=True)

    async def forbidden_api(self) -> KubeApi:
        return self.cluster.client(allowed=set())

    async def unreachable_api(self) -> KubeApi:
        down = FakeCluster()
        down.reachable = False
        return down.client()


@dataclass
class RealDriver:
    cluster: KubeCluster
    admin: client.ApiClient
    api: KubeApi
    namespace: str
    tmp: Path
    within: float = 60.0
    opened: list[KubeApi] = field(default_factory=list)

    async def deployment(self, name: str) -> None:
        apps, core = client.AppsV1Api(self.admin), client.CoreV1Api(self.admin)
        await apps.create_namespaced_deployment(self.namespace, engine_deployment(name))
        await core.create_namespaced_service(self.namespace, engine_service(name))

    async def restart(self) -> None:
        await asyncio.to_thread(self.cluster.restart_apiserver)

    async def forbidden_api(self) -> KubeApi:
        path = await asyncio.to_thread(
            self.cluster.service_account_kubeconfig, self.namespace, "nobody"
        )
        api = await connect(Access("kubeconfig", kubeconfig=path))
        self.opened.append(api)
        return api

    async def unreachable_api(self) -> KubeApi:
        path = self.tmp / "nowhere.kubeconfig"
        server = f"https://127.0.0.1:{free_port()}"
        config = kubeconfig_dict(server, self.cluster.ca_file, "token", "nobody")
        path.write_text(json.dumps(config))
        api = await connect(Access("kubeconfig", kubeconfig=path))
        self.opened.append(api)
        return api


@pytest.fixture(params=["fake", "real"])
def side(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Nothing for the fake; the real cluster's fixtures (set up only for the real side)."""
    if request.param == "fake":
        return {}
    names = ("kube_cluster", "kube_client", "kube_namespace", "kubelet")
    return {name: request.getfixturevalue(name) for name in names}


@pytest.fixture
async def kube(side: dict[str, Any], tmp_path: Path) -> AsyncIterator[Driver]:
    if not side:
        cluster = FakeCluster()
        yield FakeDriver(cluster, cluster.client())
        return
    kube_cluster: KubeCluster = side["kube_cluster"]
    admin, namespace = side["kube_client"], side["kube_namespace"]
    api = await connect(Access("kubeconfig", kubeconfig=kube_cluster.kubeconfig_path))
    driver = RealDriver(kube_cluster, admin, api, namespace, tmp_path)
    try:
        yield driver
    finally:
        for opened in [api, *driver.opened]:
            await opened.close()


async def slices_resource(kube: Driver) -> Any:
    return endpointslices(await kube.api.group_versions(ENDPOINTSLICE_GROUP))


async def next_event(
    kube: Driver, resource: Any, rv: str, pred: Callable[[WatchEvent], bool], **selectors: Any
) -> WatchEvent:
    """Watch from ``rv`` (resuming while the server ends watches) until ``pred`` holds."""
    async with asyncio.timeout(kube.within):
        while True:
            async with kube.api.watch(
                resource, kube.namespace, resource_version=rv, timeout_seconds=30, **selectors
            ) as events:
                async for event in events:
                    rv = event.resource_version or rv
                    if pred(event):
                        return event


async def test_endpointslices_are_served_in_a_known_version(kube: Driver) -> None:
    versions = await kube.api.group_versions(ENDPOINTSLICE_GROUP)
    assert {"v1", "v1beta1"} & set(versions)
    assert endpointslices(versions).plural == "endpointslices"
    assert await kube.api.group_versions("no-such-group.example.com") == ()


async def test_a_scale_at_zero_reads_as_zero_and_a_patch_round_trips(kube: Driver) -> None:
    await kube.deployment("engine")
    assert await kube.api.get_scale(kube.namespace, "engine") == 0  # absent on the wire
    assert await kube.api.patch_scale(kube.namespace, "engine", 1) == 1
    assert await kube.api.get_scale(kube.namespace, "engine") == 1
    assert await kube.api.patch_scale(kube.namespace, "engine", 0) == 0
    assert await kube.api.get_scale(kube.namespace, "engine") == 0


async def test_a_list_then_a_watch_from_its_version_sees_the_next_change(kube: Driver) -> None:
    await kube.deployment("engine")
    await kube.deployment("other")
    listed = await kube.api.list(DEPLOYMENTS, kube.namespace, field_selector="metadata.name=engine")
    assert [d["metadata"]["name"] for d in listed.items] == ["engine"]
    assert listed.resource_version
    await kube.api.patch_scale(kube.namespace, "other", 1)  # filtered out by the selector
    await kube.api.patch_scale(kube.namespace, "engine", 1)
    event = await next_event(
        kube,
        DEPLOYMENTS,
        listed.resource_version,
        # The controllers may still be writing the Deployment's status from its creation: the
        # change under test is the scale to 1.
        lambda e: e.type != "BOOKMARK" and e.object.get("spec", {}).get("replicas") == 1,
        field_selector="metadata.name=engine",
    )
    assert event.type == "MODIFIED"
    assert event.object["metadata"]["name"] == "engine"
    assert event.object["spec"]["replicas"] == 1
    assert int(event.resource_version) > int(listed.resource_version)


async def test_a_ready_pod_reaches_the_endpointslice_and_leaves_it_at_zero(kube: Driver) -> None:
    await kube.deployment("engine")
    resource = await slices_resource(kube)
    selector = {"label_selector": "kubernetes.io/service-name=engine"}
    listed = await kube.api.list(resource, kube.namespace, **selector)
    assert [ready_addresses([s]) for s in listed.items] in ([], [[]])
    await kube.api.patch_scale(kube.namespace, "engine", 1)
    up = await next_event(
        kube,
        resource,
        listed.resource_version,
        lambda e: e.type != "BOOKMARK" and bool(ready_addresses([e.object])),
        **selector,
    )
    assert up.object["metadata"]["labels"]["kubernetes.io/service-name"] == "engine"
    assert up.object["addressType"] == "IPv4"
    assert len(ready_addresses([up.object])) == 1
    await kube.api.patch_scale(kube.namespace, "engine", 0)
    down = await next_event(
        kube,
        resource,
        up.resource_version,
        lambda e: e.type != "BOOKMARK" and not ready_addresses([e.object]),
        **selector,
    )
    assert down.type in ("MODIFIED", "DELETED")


def _name(event: WatchEvent) -> str | None:
    """The object's name (``None`` for a bookmark)."""
    name: str | None = event.object.get("metadata", {}).get("name")
    return name


async def test_after_an_api_server_restart_watches_end_and_old_versions_are_gone(
    kube: Driver,
) -> None:
    await kube.deployment("engine")
    listed = await kube.api.list(DEPLOYMENTS, kube.namespace)
    await kube.deployment("other")  # a write after the list: its version predates the restart
    async with kube.api.watch(
        DEPLOYMENTS, kube.namespace, resource_version=listed.resource_version, timeout_seconds=60
    ) as events:
        # The deployment controller may write engine's status after the list: not what this asks.
        first = await anext(e async for e in events if _name(e) not in ("engine", None))
        assert (first.type, first.object["metadata"]["name"]) == ("ADDED", "other")
        restart = asyncio.ensure_future(kube.restart())
        try:
            with contextlib.suppress(Unreachable):  # the stream breaks or ends; it never hangs
                async with asyncio.timeout(kube.within):
                    async for _ in events:
                        pass
        finally:
            await restart
    async with asyncio.timeout(kube.within):
        while True:
            try:
                async with kube.api.watch(
                    DEPLOYMENTS,
                    kube.namespace,
                    resource_version=listed.resource_version,
                    timeout_seconds=5,
                ) as events:
                    async for _ in events:
                        pass
            except Unreachable:  # pooled connections to the old process
                await asyncio.sleep(0.1)
                continue
            except Gone:
                break
            raise AssertionError("a watch from before the restart was resumed")
    relisted = await kube.api.list(DEPLOYMENTS, kube.namespace)
    assert sorted(d["metadata"]["name"] for d in relisted.items) == ["engine", "other"]


async def test_bookmarks_move_the_version_past_changes_filtered_out(kube: Driver) -> None:
    """A watch that sees nothing of its own still learns how far the server got (a bookmark
    shortly before the server ends the watch), so a later resume does not start from a version
    that may be gone. Servers send bookmarks at their discretion: the API server sends them
    only past an event of that resource type, hence the change to another Deployment."""
    await kube.deployment("engine")
    await kube.deployment("other")
    selector = "metadata.name=engine"
    listed = await kube.api.list(DEPLOYMENTS, kube.namespace, field_selector=selector)
    await asyncio.sleep(1)  # the controller's own updates of "engine" settle
    seen: list[WatchEvent] = []
    bookmarks: list[WatchEvent] = []
    # The API server's bookmark timer ticks each second and its bookmark is due 2 s before
    # the watch ends: a server starved for CPU may tick late and end the watch without one.
    # A try or two more: what is checked is what a bookmark that comes carries.
    for replicas in (1, 2, 3):
        await kube.api.patch_scale(kube.namespace, "other", replicas)
        async with (
            asyncio.timeout(20),
            kube.api.watch(
                DEPLOYMENTS,
                kube.namespace,
                resource_version=listed.resource_version,
                timeout_seconds=5,
                field_selector=selector,
            ) as events,
        ):
            async for event in events:
                seen.append(event)
        bookmarks = [e for e in seen if e.type == "BOOKMARK"]
        if bookmarks:
            break
    assert all(e.object["metadata"].get("name") in (None, "engine") for e in seen)
    assert bookmarks, "a bookmark before the server ended the watch (3 tries)"
    assert int(bookmarks[-1].resource_version) > int(listed.resource_version)
    assert set(bookmarks[0].object) <= {"kind", "apiVersion", "metadata", "spec", "status"}


async def test_missing_things_are_not_found(kube: Driver) -> None:
    with pytest.raises(NotFound):
        await kube.api.get_scale(kube.namespace, "no-such-deployment")
    with pytest.raises(NotFound):
        await kube.api.patch_scale(kube.namespace, "no-such-deployment", 1)
    with pytest.raises(NotFound):  # KEDA is not installed
        await kube.api.list(SCALED_OBJECTS, kube.namespace)
    assert (await kube.api.list(HPAS, kube.namespace)).items == ()


async def test_a_lease_is_created_once_and_replaced_only_from_its_current_version(
    kube: Driver,
) -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "leader"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    with pytest.raises(NotFound):
        await kube.api.get(LEASES, kube.namespace, "leader")
    stored = await kube.api.create(LEASES, kube.namespace, lease)
    assert stored["spec"]["holderIdentity"] == "a"
    with pytest.raises(Conflict):  # the name is taken
        await kube.api.create(LEASES, kube.namespace, lease)
    read = await kube.api.get(LEASES, kube.namespace, "leader")
    assert read["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    taken = {**read, "spec": {**read["spec"], "holderIdentity": "b"}}
    updated = await kube.api.replace(LEASES, kube.namespace, taken)
    assert updated["spec"]["holderIdentity"] == "b"
    assert updated["metadata"]["resourceVersion"] != read["metadata"]["resourceVersion"]
    stale = {**read, "spec": {**read["spec"], "holderIdentity": "c"}}  # from the old version
    with pytest.raises(Conflict):
        await kube.api.replace(LEASES, kube.namespace, stale)
    assert (await kube.api.get(LEASES, kube.namespace, "leader"))["spec"]["holderIdentity"] == "b"


async def test_a_merge_patch_sets_and_removes_one_annotation_and_is_watched(
    kube: Driver,
) -> None:
    await kube.deployment("engine")
    listed = await kube.api.list(DEPLOYMENTS, kube.namespace, field_selector="metadata.name=engine")
    (before,) = listed.items
    patch = {"metadata": {"annotations": {"warmgate.io/cold-start": '{"starts":[8.2]}'}}}
    stored = await kube.api.patch(DEPLOYMENTS, kube.namespace, "engine", patch)
    annotations = stored["metadata"]["annotations"]
    assert annotations["warmgate.io/cold-start"] == '{"starts":[8.2]}'
    assert stored["spec"] == before["spec"]  # nothing else: the pods are not rolled
    # A Deployment counts an annotation change as a new generation (as it does a spec change).
    assert stored["metadata"]["generation"] == before["metadata"]["generation"] + 1
    event = await next_event(
        kube,
        DEPLOYMENTS,
        listed.resource_version,
        lambda e: "warmgate.io/cold-start" in (e.object["metadata"].get("annotations") or {}),
        field_selector="metadata.name=engine",
    )
    assert event.type == "MODIFIED"
    removed = {"metadata": {"annotations": {"warmgate.io/cold-start": None}}}
    stored = await kube.api.patch(DEPLOYMENTS, kube.namespace, "engine", removed)
    assert "warmgate.io/cold-start" not in (stored["metadata"].get("annotations") or {})
    with pytest.raises(NotFound):
        await kube.api.patch(DEPLOYMENTS, kube.namespace, "no-such-deployment", patch)


async def test_core_objects_a_configmap_and_pods(kube: Driver) -> None:
    """The core group (``/api/v1``): a ConfigMap made, merge-patched key by key, read back;
    pods listed and watched by label like any other resource."""
    with pytest.raises(NotFound):
        await kube.api.get(CONFIGMAPS, kube.namespace, "warmgate-state")
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "warmgate-state"},
        "data": {"budget.a": '{"spent":1}'},
    }
    await kube.api.create(CONFIGMAPS, kube.namespace, body)
    with pytest.raises(Conflict):
        await kube.api.create(CONFIGMAPS, kube.namespace, body)
    patch = {"data": {"budget.b": '{"spent":2}'}}
    stored = await kube.api.patch(CONFIGMAPS, kube.namespace, "warmgate-state", patch)
    assert stored["data"] == {"budget.a": '{"spent":1}', "budget.b": '{"spent":2}'}
    read = await kube.api.get(CONFIGMAPS, kube.namespace, "warmgate-state")
    assert read["data"] == stored["data"]
    listed = await kube.api.list(PODS, kube.namespace, label_selector="app=engine")
    assert listed.items == () and listed.resource_version
    async with kube.api.watch(
        PODS,
        kube.namespace,
        resource_version=listed.resource_version,
        timeout_seconds=1,
        label_selector="app=engine",
    ) as events:
        async for event in events:
            assert event.type == "BOOKMARK"


async def test_what_rbac_does_not_grant_is_forbidden(kube: Driver) -> None:
    await kube.deployment("engine")
    api = await kube.forbidden_api()
    with pytest.raises(Forbidden) as err:
        await api.list(DEPLOYMENTS, kube.namespace)
    assert "forbidden" in err.value.message
    with pytest.raises(Forbidden):
        await api.patch_scale(kube.namespace, "engine", 1)
    with pytest.raises(Forbidden):
        async with api.watch(
            DEPLOYMENTS, kube.namespace, resource_version="", timeout_seconds=5
        ) as events:
            async for _ in events:
                pass


async def test_no_server_is_unreachable(kube: Driver) -> None:
    api = await kube.unreachable_api()
    with pytest.raises(Unreachable):
        await api.list(DEPLOYMENTS, kube.namespace)
    with pytest.raises(Unreachable):
        await api.patch_scale(kube.namespace, "engine", 1)
    with pytest.raises(KubeError):
        await api.group_versions(ENDPOINTSLICE_GROUP)
