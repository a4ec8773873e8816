"""Every object of every deploy/ tree (base, each overlay, the KEDA and monitoring Components,
Flux) sent to the real API server: server-side dry run, strict field validation (the server's
where it has it, 1.25+; kubectl's against the server's own schemas before), with the upstream
CRDs of the non-built-in kinds installed from shared/crds (tests/kube/crds.py).

What the server does not serve is not sent and is named: on a server older than DRA
(resource.k8s.io/v1, 1.34) the ResourceClaim(Template)s and the pods' claim fields, and the
objects of a CRD whose current upstream schema an old server refuses (1.20: Gateway API and
ServiceMonitor); everything else goes in as written, but a PodDisruptionBudget goes in as the
policy version the server serves (policy/v1 from 1.21). tests/kube/test_deploy_apply.py applies
the core objects for real and acts as warmgate's ServiceAccount."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_tree import DEPLOY, kubectl

from .cluster import KubeCluster
from .crds import CRDS, DRA, as_served, install_crds, served_versions
from .test_deploy_apply import Kubectl

Obj = dict[str, Any]
TREES = {
    "base": ["base"],
    "overlays/single-node": ["overlays/single-node"],
    "overlays/shared-gpu": ["overlays/shared-gpu"],
    "base + keda": ["base", "keda"],
    "base + monitoring": ["base", "monitoring"],
    "flux": ["flux"],
}
"""Each tree: a kustomization (or a base and a Component on it), as a user renders it."""
MADE_ELSEWHERE = ["flux-system", "monitoring"]
"""Namespaces deploy/ puts objects in and does not make (Flux's and the monitoring stack's)."""


def render(parts: list[str]) -> list[Obj]:
    """``kubectl kustomize`` of the tree; a Component goes on the base in an overlay of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        overlay = Path(tmp)
        kustomization: Obj = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY / parts[0], overlay)],
            "components": [os.path.relpath(DEPLOY / c, overlay) for c in parts[1:]],
        }
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        done = subprocess.run(
            [kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"kubectl kustomize {parts}:\n{done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@dataclass(frozen=True)
class Server:
    served: set[str]
    """``group/version``s served, the CRDs' included."""
    refused: dict[str, str]
    """CRD ``group/version Kind``s the server would not take, with its words."""


@pytest.fixture(scope="module")
def server(kube_cluster: KubeCluster) -> Server:
    """The CRDs installed (once for the module) and the namespaces deploy/ needs made."""
    k = Kubectl(kube_cluster)
    refused = install_crds(kube_cluster, k)
    for name in ["warmgate", "render", *MADE_ELSEWHERE]:
        k.said("create", "namespace", name)  # there already: fine
    return Server(served_versions(kube_cluster), refused)


@pytest.mark.parametrize("tree", list(TREES))
async def test_every_object_of_the_tree_passes_a_server_side_dry_run(
    kube_cluster: KubeCluster, server: Server, tree: str
) -> None:
    objects = await asyncio.to_thread(render, TREES[tree])
    sent, left_out = as_served(objects, server.served, server.refused)
    allowed = (DRA, "the resourceClaims", *server.refused)
    for line in left_out:
        assert line.startswith(allowed), f"not served: {line}"
    if DRA in server.served:
        assert not [line for line in left_out if line.startswith((DRA, "the resourceClaims"))]
    k = Kubectl(kube_cluster)
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": sent})
    out = await k("apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=manifest)
    lines = out.splitlines()
    assert len(lines) == len(sent), out
    assert all(line.endswith("(server dry run)") for line in lines), out
    kinds = {o["kind"] for o in sent}
    print(f"\n{tree}: {len(sent)} objects accepted ({', '.join(sorted(kinds))}); not sent:")
    print("  " + "\n  ".join(left_out or ["nothing"]))


async def test_an_unknown_field_is_refused(kube_cluster: KubeCluster, server: Server) -> None:
    """The same command refuses what strict validation is for: a field no schema has, in a
    built-in kind and in a CRD's (KEDA's, which every version from 1.20 takes)."""
    k = Kubectl(kube_cluster)
    base_and_keda = await asyncio.to_thread(render, TREES["base + keda"])
    objects, _ = as_served(base_and_keda, server.served, server.refused)
    for kind in ("Deployment", "ScaledObject"):
        obj = next(o for o in objects if o["kind"] == kind)
        obj["spec"]["replicaz"] = 1
        said = await k.refused(
            "apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=json.dumps(obj)
        )
        assert "replicaz" in said, said


def test_the_crds_are_served(kube_cluster: KubeCluster, server: Server) -> None:
    """Every CRD is served, except, on an old server, one whose current schema it refuses
    (named here; from 1.31, the oldest Kubernetes Gateway API v1.6 supports, none is)."""
    crds = {
        "gateway.networking.k8s.io/v1 Gateway",
        "gateway.networking.k8s.io/v1 HTTPRoute",
        "keda.sh/v1alpha1 ScaledObject",
        "monitoring.coreos.com/v1 ServiceMonitor",
        "monitoring.coreos.com/v1 PrometheusRule",
        "source.toolkit.fluxcd.io/v1 GitRepository",
        "kustomize.toolkit.fluxcd.io/v1 Kustomization",
    }
    status, listed = kube_cluster.request(
        "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    )
    assert status == 200, listed
    installed = {
        f"{c['spec']['group']}/{v['name']} {c['spec']['names']['kind']}"
        for c in listed["items"]
        for v in c["spec"]["versions"]
        if v["served"]
    }
    assert crds <= installed | set(server.refused)
    for version, why in sorted(server.refused.items()):
        print(f"\n{kube_cluster.version.text} refused the CRD of {version}: {why}")
    if kube_cluster.version.at_least(1, 31):
        assert server.refused == {}
    assert "keda.sh/v1alpha1" in server.served and CRDS.is_dir()
