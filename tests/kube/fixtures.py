"""pytest fixtures for the real control plane. Import them into a test module::

    from tests.kube.fixtures import kube_cluster_fixture, kubelet_fixture  # noqa: F401

(or relatively, ``from .fixtures import ...``). The fixtures are named ``kube_cluster``,
``kubelet``, ``kube_client`` and ``kube_namespace``.

Without the binaries (``make kube-bins``) the tests skip, unless ``WARMGATE_KUBE_REQUIRED`` is
set (CI), where they fail.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from . import netns
from .cluster import KubeBinaries, KubeCluster, new_api_client
from .flags import makes_token_secrets
from .kubelet import TestKubelet

_no_pod_network: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Into a network namespace with the pod network (netns.py) before any test or thread
    runs, so the test kubelet's pods get addresses that every Kubernetes version publishes;
    only when the run holds tests/kube (other tests may need the network outside)."""
    global _no_pod_network  # said once per process, before any test
    if _runs_kube_tests(config.args, Path(config.invocation_params.dir)):
        _no_pod_network = netns.enter()


def _runs_kube_tests(args: list[str], root: Path) -> bool:
    """Whether the paths pytest was given hold tests/kube (none given: the whole suite)."""
    kube = (Path(__file__).parent).resolve()
    paths = [(root / a.split("::")[0]).resolve() for a in args if not a.startswith("-")]
    return not paths or any(p == kube or p in kube.parents or kube in p.parents for p in paths)


@pytest.fixture(scope="session", name="kube_cluster")
def kube_cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """etcd + kube-apiserver + kube-controller-manager (+ kube-scheduler when built), one per
    test session."""
    bins = KubeBinaries.find()
    if bins is None:
        msg = (
            f"{KubeBinaries.missing_in()}: run `make kube-bins` for v1.20.2, or set "
            "WARMGATE_KUBE_BIN to a directory holding another version's (docs/kubernetes.md)"
        )
        if os.environ.get("WARMGATE_KUBE_REQUIRED"):
            pytest.fail(msg + " and WARMGATE_KUBE_REQUIRED is set", pytrace=False)
        pytest.skip(msg)
    if _no_pod_network is not None and bins.version.at_least(1, 21):
        # From 1.21 (discovery.k8s.io/v1) an EndpointSlice refuses a loopback address.
        pytest.fail(
            f"Kubernetes {bins.version.text} publishes no loopback pod addresses, and the "
            f"pod network could not be made: {_no_pod_network}",
            pytrace=False,
        )
    # A short path: the directory holds the etcd data and the PKI.
    cluster = KubeCluster.start(bins, Path(tmp_path_factory.mktemp("kube")))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(name="kube_client")
async def kube_client_fixture(kube_cluster: KubeCluster) -> AsyncIterator[client.ApiClient]:
    """A kubernetes_asyncio ApiClient authenticated as the cluster admin."""
    api = await new_api_client(kube_cluster.kubeconfig_path)
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture(name="kubelet")
async def kubelet_fixture(kube_cluster: KubeCluster, tmp_path: Path) -> AsyncIterator[TestKubelet]:
    """The test kubelet, running in the test's event loop; pod logs go to tmp_path/pods."""
    api = await new_api_client(kube_cluster.kubeconfig_path)
    try:
        bind = not kube_cluster.has_scheduler  # else kube-scheduler binds the pods
        async with TestKubelet(api, log_dir=tmp_path / "pods", bind=bind) as kubelet:
            yield kubelet
    finally:
        await api.close()


@pytest.fixture(name="kube_namespace")
async def kube_namespace_fixture(
    kube_cluster: KubeCluster, kube_client: client.ApiClient
) -> AsyncIterator[str]:
    """A fresh namespace, deleted afterwards (without waiting for it to go). Its pods are
    force-deleted, so none are left for a later test's kubelet to clean up."""
    core = client.CoreV1Api(kube_client)
    name = f"t-{uuid.uuid4().hex[:10]}"
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        await _default_service_account(core, name, makes_token_secrets(kube_cluster.version))
        yield name
    finally:
        await core.delete_namespace(name)  # Terminating: no new pods from here on
        await core.delete_collection_namespaced_pod(name, grace_period_seconds=0)


async def _default_service_account(
    core: client.CoreV1Api, namespace: str, token_secret: bool
) -> None:
    """Until the controller-manager has made the namespace's ``default`` ServiceAccount (and,
    before 1.24, its token Secret, which 1.20's admission mounts into every pod), no pod may be
    created there: a Deployment scaled up meanwhile reports ``ReplicaFailure``, which warmgate
    rightly takes for a failed start. A namespace in a real cluster has had both long before
    anything is deployed. After a control-plane restart (a test before may make one) the
    controller-manager takes its time to catch up on a loaded machine: up to 90 s."""
    async with asyncio.timeout(90):
        while True:
            try:
                account = await core.read_namespaced_service_account("default", namespace)
                if account.secrets or not token_secret:
                    return
            except ApiException as exc:
                if exc.status != 404:
                    raise
            await asyncio.sleep(0.05)
