"""warmgate's own access to the test cluster: deploy/'s ServiceAccount, Role and RoleBinding in a
namespace, and a kubeconfig that authenticates as that ServiceAccount (nothing but its Roles)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from backends.kubernetes.api import DEPLOYMENTS, Forbidden
from backends.kubernetes.client import Access, connect
from tests.deploy_tree import router_rbac

from .cluster import KubeCluster


async def apply_rbac(admin: client.ApiClient, namespace: str) -> None:
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    for obj in router_rbac({"render": namespace, "warmgate": namespace}):
        create = {
            "ServiceAccount": core.create_namespaced_service_account,
            "Role": rbac.create_namespaced_role,
            "RoleBinding": rbac.create_namespaced_role_binding,
        }[obj["kind"]]
        await create(namespace, obj)


async def as_warmgate(
    cluster: KubeCluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """The ServiceAccount's kubeconfig, set as KUBECONFIG (not the in-cluster one) for warmgate
    to find; returned once RBAC's caches let it list the Deployments (within moments)."""
    kubeconfig = await asyncio.to_thread(
        cluster.service_account_kubeconfig, namespace, "warmgate", False
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    api = await connect(Access("kubeconfig", kubeconfig=kubeconfig))
    try:
        async with asyncio.timeout(10):
            while True:
                try:
                    await api.list(DEPLOYMENTS, namespace)
                    break
                except Forbidden:
                    await asyncio.sleep(0.1)
    finally:
        await api.close()
    return kubeconfig
