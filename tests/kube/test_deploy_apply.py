"""deploy/'s core objects (the PriorityClasses included) applied with kubectl to the real test
API server, in the versions it serves: what it does not serve (DRA's ResourceClaim(Template)s
and the pods' claim fields before 1.34) is left out, and the PodDisruptionBudget goes in as the
policy version it serves (policy/v1 from 1.21, same fields); CRD kinds are sent by
test_deploy_dry_run.py, and tests/test_deploy.py validates all of them offline against a current
schema. Then warmgate's ServiceAccount does, with its own token, what several replicas do in
namespace warmgate: take and renew the leader Lease, list the peers' EndpointSlices; and what
it does in namespace render: scale a render Deployment, and no more."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy_tree import CRD_KINDS, build, kubectl

from .cluster import KubeCluster
from .crds import DRA, as_served, served_versions

ROUTER = "system:serviceaccount:warmgate:warmgate"
LEASE, PEERS = "warmgate-leader", "warmgate-peers"


def core_objects(tree: str, served: set[str]) -> list[dict[str, Any]]:
    """The tree's built-in objects, as the server can take them (crds.as_served)."""
    objects, _ = as_served(
        [o for o in build(tree) if (o["apiVersion"], o["kind"]) not in CRD_KINDS], served
    )
    return objects


CONTROLLERS_WRITE = ("deployment.kubernetes.io/revision",)
"""Annotations the controllers write on the objects (not the manifest's, not kubectl's)."""


def own_fields(listed: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Each object as the manifest and kubectl's apply made it: the resourceVersion, status,
    managedFields and what the controllers add (a revision, a ServiceAccount's token Secret
    before 1.24) are left out, so a controller at work between two reads is no change; the
    ``generation`` stays (it moves with every change of the spec)."""
    out = {}
    for obj in listed.get("items") or [listed]:
        obj = json.loads(json.dumps(obj))
        meta = obj["metadata"]
        for key in ("resourceVersion", "managedFields"):
            meta.pop(key, None)
        for key in CONTROLLERS_WRITE:
            (meta.get("annotations") or {}).pop(key, None)
        obj.pop("status", None)
        if obj["kind"] == "ServiceAccount":
            obj.pop("secrets", None)
        out[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
    return out


class Kubectl:
    def __init__(self, cluster: KubeCluster, kubeconfig: Path | None = None) -> None:
        self.cluster = cluster
        self.kubeconfig = kubeconfig or cluster.kubeconfig_path

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return self._run(*args, stdin=stdin, check=check).stdout

    def _run(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [kubectl(), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0 or not check, f"kubectl {' '.join(args)}:\n{done.stderr}"
        return done

    def said(self, *args: str) -> str:
        """Run it, failing or not; all it printed."""
        done = self._run(*args, check=False)
        return done.stdout + done.stderr

    def run_checked(self, *args: str) -> bool:
        """Run it; whether it succeeded."""
        return self._run(*args, check=False).returncode == 0

    async def refused(self, *args: str, stdin: str | None = None) -> str:
        """Run it; it must fail. Returns what kubectl said (stderr)."""
        done = await asyncio.to_thread(self._run, *args, stdin=stdin, check=False)
        assert done.returncode != 0, f"kubectl {' '.join(args)} was allowed:\n{done.stdout}"
        return done.stderr

    async def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return await asyncio.to_thread(self.run, *args, stdin=stdin, check=check)


async def remove(k: Kubectl, manifest: str) -> None:
    """Delete it all and wait until it is gone. The test cluster runs no PVC/PV protection
    controller, so their finalizers are lifted here as that controller would (nothing uses
    them)."""
    await k("delete", "--wait=false", "--ignore-not-found", "-f", "-", stdin=manifest)
    unfinalize = ["--type=merge", "-p", '{"metadata":{"finalizers":null}}']
    await k("patch", "pvc/models", "-n", "render", *unfinalize, check=False)
    await k("patch", "pv/render-models", *unfinalize, check=False)
    await gone(k)


async def gone(k: Kubectl) -> None:
    """Until deploy/'s namespaces and volume are gone (a namespace being deleted takes nothing
    new). The scheduler binds warmgate's pods to the test node once a test kubelet registered
    it, and no kubelet here confirms their graceful end: they are taken away at once, as a
    kubelet would once they stopped (again, for those a ReplicaSet made meanwhile)."""
    names = ["namespace/render", "namespace/warmgate", "pv/render-models"]
    force = ["--all", "--grace-period=0", "--force", "--wait=false"]
    for _ in range(4):
        for namespace in ("warmgate", "render"):
            await k("delete", "pods", "-n", namespace, *force, check=False)
        done = await asyncio.to_thread(
            k.run_checked, "wait", "--for=delete", "--timeout=60s", *names
        )
        if done:
            return


async def act_as_the_router(cluster: KubeCluster) -> None:
    """With warmgate's own token: the Lease as leader election uses it (create, get, a
    conditional update; a stale one is a conflict), the peers' EndpointSlices, and a render
    Deployment's scale; what the Role does not grant is refused."""
    kubeconfig = await asyncio.to_thread(
        cluster.service_account_kubeconfig, "warmgate", "warmgate", False
    )
    sa = Kubectl(cluster, kubeconfig)
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": "warmgate"},
        "spec": {"holderIdentity": "warmgate-a", "leaseDurationSeconds": 15},
    }
    await sa("create", "-f", "-", stdin=json.dumps(lease))
    got = json.loads(await sa("get", "lease", LEASE, "-n", "warmgate", "-o=json"))
    got["spec"]["holderIdentity"] = "warmgate-b"
    await sa("replace", "-f", "-", stdin=json.dumps(got))  # PUT with its resourceVersion
    stale = await sa.refused("replace", "-f", "-", stdin=json.dumps(got))
    assert "the object has been modified" in stale, "a stale update is a conflict (409)"
    now = json.loads(await sa("get", "lease", LEASE, "-n", "warmgate", "-o=json"))
    assert now["spec"]["holderIdentity"] == "warmgate-b"
    assert "forbidden" in await sa.refused("delete", "lease", LEASE, "-n", "warmgate")
    # The EndpointSlice controller makes the headless Service's slices (empty here: no node
    # runs the pods); warmgate lists them by the service-name label, as its informer does.
    selector = f"kubernetes.io/service-name={PEERS}"
    async with asyncio.timeout(30):
        while True:
            listed = await sa(
                "get",
                "endpointslices.discovery.k8s.io",
                "-n",
                "warmgate",
                "-l",
                selector,
                "-o=json",
            )
            owners = {
                (o["kind"], o["name"])
                for item in json.loads(listed)["items"]
                for o in item["metadata"].get("ownerReferences") or ()
            }
            if owners:
                break
            await asyncio.sleep(0.2)
    assert owners == {("Service", PEERS)}
    assert "forbidden" in await sa.refused("get", "pods", "-n", "warmgate")
    # In render: what scaling from zero takes works (the Scale read and patched, the
    # Deployment and its pods watched), and what it does not take is refused.
    await sa("scale", "deployment/comfyui", "-n", "render", "--replicas=1")
    scaled = json.loads(await sa("get", "deployment/comfyui", "-n", "render", "-o=json"))
    assert scaled["spec"]["replicas"] == 1
    await sa("scale", "deployment/comfyui", "-n", "render", "--replicas=0")
    await sa("get", "pods", "-n", "render")
    for refused in (
        ["delete", "deployment/comfyui", "-n", "render"],
        ["delete", "pod/anything", "-n", "render"],
        ["get", "secrets", "-n", "render"],
        ["create", "deployment", "other", "--image=x", "-n", "render"],
    ):
        assert "forbidden" in await sa.refused(*refused), refused


@pytest.mark.parametrize("tree", ["base", "overlays/single-node"])
async def test_the_core_objects_apply_to_a_real_api_server(
    kube_cluster: KubeCluster, tree: str
) -> None:
    served = served_versions(kube_cluster)
    objects = core_objects(tree, served)
    one_replica = {"PodDisruptionBudget"} if tree == "overlays/single-node" else set()
    dra = {"ResourceClaimTemplate"} if DRA in served else set()
    assert {o["kind"] for o in objects} | one_replica == dra | {
        "PodDisruptionBudget",
        "NetworkPolicy",
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Service",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "Deployment",
        "PriorityClass",
    }
    k = Kubectl(kube_cluster)
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    await gone(k)  # an earlier tree's, still being deleted
    try:
        out = await k("apply", "-f", "-", stdin=manifest)
        # PriorityClasses are cluster-wide: a test before this one may have made them already.
        made = [line for line in out.splitlines() if not line.startswith("priorityclass")]
        assert all(line.endswith(" created") for line in made), out
        assert len(out.splitlines()) == len(objects), out
        # Applying twice changes nothing: by what the server keeps, not by kubectl's word
        # (from 1.21 a policy/v1 PDB prints "configured" though nothing changes: its selector's
        # patch strategy is replace).
        before = own_fields(json.loads(await k("get", "-f", "-", "-o=json", stdin=manifest)))
        await k("apply", "-f", "-", stdin=manifest)
        after = own_fields(json.loads(await k("get", "-f", "-", "-o=json", stdin=manifest)))
        changed = [key for key in before if before[key] != after.get(key)]
        assert changed == [], f"applying twice changes nothing: {changed}"
        for obj in objects:
            meta = obj["metadata"]
            where = ["-n", meta["namespace"]] if "namespace" in meta else []
            got = json.loads(await k("get", obj["kind"].lower(), meta["name"], *where, "-o=json"))
            assert got["metadata"]["name"] == meta["name"]
            if obj["kind"] == "Deployment":
                assert got["spec"]["replicas"] == obj["spec"]["replicas"]
        # The Roles are what warmgate's ServiceAccount may do, as the API server sees it.
        for verb, what, want in [
            ("patch", ["deployments", "--subresource=scale", "-n", "render"], "yes"),
            ("watch", ["endpointslices.discovery.k8s.io", "-n", "render"], "yes"),
            ("create", ["leases.coordination.k8s.io", "-n", "warmgate"], "yes"),
            ("update", [f"leases.coordination.k8s.io/{LEASE}", "-n", "warmgate"], "yes"),
            ("update", ["leases.coordination.k8s.io/other", "-n", "warmgate"], "no"),
            ("delete", [f"leases.coordination.k8s.io/{LEASE}", "-n", "warmgate"], "no"),
            ("list", ["leases.coordination.k8s.io", "-n", "warmgate"], "no"),
            ("watch", ["endpointslices.discovery.k8s.io", "-n", "warmgate"], "yes"),
            ("list", ["pods", "-n", "warmgate"], "no"),
            # the render Deployments by name only, for the learned cold-start annotation
            ("patch", ["deployments/comfyui", "-n", "render"], "yes"),
            ("patch", ["deployments/other", "-n", "render"], "no"),
            ("patch", ["deployments", "-n", "render"], "no"),
            ("watch", ["pods", "-n", "render"], "yes"),  # the stage of a start
            ("patch", ["pods", "-n", "render"], "no"),
            ("create", ["configmaps", "-n", "warmgate"], "yes"),  # the day's spend, kept
            ("patch", ["configmaps/warmgate-state", "-n", "warmgate"], "yes"),
            ("patch", ["configmaps/other", "-n", "warmgate"], "no"),
            ("list", ["configmaps", "-n", "warmgate"], "no"),
            ("list", ["deployments", "-n", "default"], "no"),
            ("list", ["secrets", "-n", "warmgate"], "no"),
        ]:
            answer = await k("auth", "can-i", verb, *what, "--as", ROUTER, check=False)
            assert answer.strip() == want, (verb, what)
        await act_as_the_router(kube_cluster)
    finally:
        await remove(k, manifest)
