"""End to end against the real control plane with the real kubernetes_asyncio client:
scale 0 -> 1 -> 0 through the scale subresource, EndpointSlices from the real controller,
a watch across an apiserver restart, and a ServiceAccount client limited by RBAC."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from .cluster import KubeCluster, new_api_client
from .kubelet import TestKubelet
from .netns import node_address, pod_address
from .workloads import deployment, engine_service

PORT = 8080


def web_deployment(name: str, docroot: Path) -> dict[str, Any]:
    container = {
        "name": "web",
        "image": "local/python",
        "command": [sys.executable, "-m", "http.server", "--bind", "{host}", "{port}"],
        "workingDir": str(docroot),
        "ports": [{"name": "http", "containerPort": PORT}],
        "readinessProbe": {"httpGet": {"path": "/hello.txt", "port": "http"}, "periodSeconds": 1},
    }
    return deployment(name, container)


async def watch_until(
    func: Any, pred: Callable[[dict[str, Any]], bool], within: float = 60, **kwargs: Any
) -> dict[str, Any]:
    """Stream a watch (dict objects) until pred(raw object) holds; returns that object."""
    async with asyncio.timeout(within), watch.Watch() as w:
        async for ev in w.stream(func, **kwargs):
            if ev["type"] in ("ADDED", "MODIFIED") and pred(ev["raw_object"]):
                return dict(ev["raw_object"])
    raise AssertionError("watch ended")


def configmap(name: str) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name))


def ready_addresses(slice_: dict[str, Any]) -> list[str]:
    return [
        a
        for ep in slice_.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready")
        for a in ep.get("addresses") or []
    ]


async def test_pod_addresses_bind() -> None:
    """Linux routes all of 127.0.0.0/8 to lo, and netns.py routes the pod network there: the
    test kubelet gives each pod its own address."""
    for host in (pod_address(2), pod_address(3 << 8 | 7)):
        with socket.socket() as s:
            s.bind((host, 0))
            s.listen()
            with socket.create_connection(s.getsockname(), timeout=2):
                pass


async def test_endpointslice_version_is_discovered(kube_cluster: KubeCluster) -> None:
    served = "v1" if kube_cluster.version.at_least(1, 21) else "v1beta1"
    assert kube_cluster.endpointslice_api_version == f"discovery.k8s.io/{served}"
    status, body = kube_cluster.request("GET", "/version")
    assert status == 200 and body["gitVersion"] == kube_cluster.version.text


async def test_scale_zero_one_zero(
    kube_cluster: KubeCluster,
    kube_client: client.ApiClient,
    kube_namespace: str,
    kubelet: TestKubelet,
    tmp_path: Path,
) -> None:
    ns, name = kube_namespace, "web"
    apps, core = client.AppsV1Api(kube_client), client.CoreV1Api(kube_client)
    custom = client.CustomObjectsApi(kube_client)
    group, version = kube_cluster.endpointslice_api_version.split("/")
    (tmp_path / "hello.txt").write_text("hello from the pod\n")

    await apps.create_namespaced_deployment(ns, web_deployment(name, tmp_path))
    await core.create_namespaced_service(ns, engine_service(name, PORT))
    scale = await apps.read_namespaced_deployment_scale(name, ns)
    assert not scale.spec.replicas  # 0 comes back absent

    await apps.patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": 1}})
    slice_ = await watch_until(
        custom.list_namespaced_custom_object,
        lambda s: bool(ready_addresses(s)),
        group=group,
        version=version,
        namespace=ns,
        plural="endpointslices",
        label_selector=f"kubernetes.io/service-name={name}",
    )
    (addr,) = ready_addresses(slice_)
    assert addr == pod_address(int(ipaddress.ip_address(addr)) & 0xFFFF)
    assert addr not in (node_address(), "127.0.0.1")
    assert [p["port"] for p in slice_["ports"]] == [PORT]
    pods = (await core.list_namespaced_pod(ns, label_selector=f"app={name}")).items
    assert [p.status.pod_ip for p in pods] == [addr]
    assert pods[0].metadata.owner_references[0].kind == "ReplicaSet"

    async with aiohttp.ClientSession() as http, http.get(f"http://{addr}:{PORT}/hello.txt") as r:
        assert r.status == 200
        assert await r.text() == "hello from the pod\n"

    await apps.patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": 0}})
    scale = await apps.read_namespaced_deployment_scale(name, ns)
    assert (scale.spec.replicas or 0) == 0
    for _ in range(300):
        if not (await core.list_namespaced_pod(ns, label_selector=f"app={name}")).items:
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError("pod not deleted within 60 s")
    assert not kubelet.workloads
    with pytest.raises(aiohttp.ClientError):
        async with aiohttp.ClientSession() as http, http.get(f"http://{addr}:{PORT}/"):
            pass
    # The EndpointSlice controller follows on its own schedule: the address goes, the slice stays.
    emptied = await watch_until(
        custom.list_namespaced_custom_object,
        lambda s: not ready_addresses(s),
        group=group,
        version=version,
        namespace=ns,
        plural="endpointslices",
        label_selector=f"kubernetes.io/service-name={name}",
    )
    assert emptied["metadata"]["name"] == slice_["metadata"]["name"]


async def test_watch_resumes_after_apiserver_restart(
    kube_cluster: KubeCluster,
    kube_client: client.ApiClient,
    kube_namespace: str,
    kubelet: TestKubelet,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    core = client.CoreV1Api(kube_client)
    seen: list[tuple[str, str]] = []  # (how, name): how is a watch event type or "LIST"
    present: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
    errors: list[int | str] = []

    async def informer() -> None:
        """List, then watch from the list's resourceVersion, resuming from the last one seen;
        relist on 410 Gone (as informers do)."""
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    cms = await core.list_namespaced_config_map(ns)
                    rv = cms.metadata.resource_version
                    for cm in cms.items:
                        seen.append(("LIST", cm.metadata.name))
                        present[cm.metadata.name].set()
                async with watch.Watch() as w:
                    async for ev in w.stream(
                        core.list_namespaced_config_map,
                        ns,
                        resource_version=rv,
                        timeout_seconds=300,
                        allow_watch_bookmarks=True,
                    ):
                        rv = ev["raw_object"]["metadata"]["resourceVersion"]
                        if ev["type"] != "BOOKMARK":
                            name = ev["raw_object"]["metadata"]["name"]
                            seen.append((ev["type"], name))
                            present[name].set()
            except ApiException as e:
                errors.append(e.status)
                if e.status == 410:
                    rv = None
                await asyncio.sleep(0.2)
            except (aiohttp.ClientError, OSError) as e:
                errors.append(type(e).__name__)
                await asyncio.sleep(0.2)

    async def wait_present(name: str) -> None:
        async with asyncio.timeout(30):
            await present[name].wait()

    task = asyncio.create_task(informer())
    try:
        await core.create_namespaced_config_map(ns, configmap("before"))
        await wait_present("before")
        await asyncio.to_thread(kube_cluster.restart_apiserver)
        await core.create_namespaced_config_map(ns, configmap("after"))
        await wait_present("after")
        # Once the informer is back on a watch, new objects arrive as watch events.
        await core.create_namespaced_config_map(ns, configmap("later"))
        await wait_present("later")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert errors, "the watch should have broken while the apiserver was down"
    assert {name for _, name in seen} >= {"before", "after"}  # by a watch event or a relist
    assert ("ADDED", "later") in seen

    # The test kubelet resumed too: a new pod still gets bound, run and marked Ready.
    (tmp_path / "hello.txt").write_text("hi\n")
    apps = client.AppsV1Api(kube_client)
    await apps.create_namespaced_deployment(ns, web_deployment("after", tmp_path))
    await apps.patch_namespaced_deployment_scale("after", ns, {"spec": {"replicas": 1}})
    await watch_until(
        core.list_namespaced_pod,
        lambda p: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        ),
        namespace=ns,
        label_selector="app=after",
    )


async def test_service_account_client_has_only_its_rbac(
    kube_cluster: KubeCluster, kube_client: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    kubeconfig = await asyncio.to_thread(kube_cluster.service_account_kubeconfig, ns, "router")
    sa_api = await new_api_client(kubeconfig)
    try:
        sa_apps = client.AppsV1Api(sa_api)
        with pytest.raises(ApiException) as err:
            await sa_apps.list_namespaced_deployment(ns)
        assert err.value.status == 403

        rbac = client.RbacAuthorizationV1Api(kube_client)
        await rbac.create_namespaced_role(
            ns,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="scaler"),
                rules=[
                    client.V1PolicyRule(
                        api_groups=["apps"],
                        resources=["deployments"],
                        verbs=["get", "list", "watch"],
                    )
                ],
            ),
        )
        await rbac.create_namespaced_role_binding(
            ns,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="scaler"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="Role", name="scaler"
                ),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="router", namespace=ns)],
            ),
        )
        async with asyncio.timeout(10):
            while True:  # RBAC caches catch up within moments
                try:
                    assert (await sa_apps.list_namespaced_deployment(ns)).items == []
                    break
                except ApiException as e:
                    assert e.status == 403
                    await asyncio.sleep(0.1)
        with pytest.raises(ApiException) as err:
            await sa_apps.patch_namespaced_deployment_scale("x", ns, {"spec": {"replicas": 1}})
        assert err.value.status == 403  # no scale permission
        with pytest.raises(ApiException) as err:
            await sa_apps.list_namespaced_deployment("default")
        assert err.value.status == 403  # other namespaces stay closed
    finally:
        await sa_api.close()


async def test_after_api_server_restarts_the_scheduler_places_a_pod_at_once(
    kube_cluster: KubeCluster,
    kube_client: client.ApiClient,
    kube_namespace: str,
    kubelet: TestKubelet,
) -> None:
    """Three restarts in a row (as the suite makes them within a minute): the harness starts
    kube-scheduler afresh each time, so a pod made right after is bound within seconds, not
    after client-go's grown watch backoff (30-60 s on 1.36)."""
    if not kube_cluster.has_scheduler:
        pytest.skip("kube-scheduler not built")
    for _ in range(3):
        await asyncio.to_thread(kube_cluster.restart_apiserver)
    core = client.CoreV1Api(kube_client)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "placed"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "local/none", "command": ["true"]}],
        },
    }
    await core.create_namespaced_pod(kube_namespace, pod)
    for _ in range(50):  # 10 s
        if (await core.read_namespaced_pod("placed", kube_namespace)).spec.node_name:
            return
        await asyncio.sleep(0.2)
    pytest.fail("not placed within 10 s of the API server's third restart")
