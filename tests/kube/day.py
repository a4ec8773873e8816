"""A cluster for a day of contention (loadtests/cluster_day.py, test_cluster_day.py): nodes whose
GPUs the real kube-scheduler places by ``nvidia.com/gpu``, a batch queue of ``batch/v1`` Jobs at
priority ``batch`` that never empties, and two render Deployments of the demo engine (an image UI
and a slower video one, replicas 0, one GPU each) behind warmgate's ``kubernetes`` backend.

A policy says how the render pods compete for the GPUs and when warmgate lets them go:

- ``always``: one replica each all day (the UIs keep their GPUs);
- ``fixed``: scaled to zero after a fixed idle window, at a priority above batch that never
  preempts (the KEDA HTTP add-on setup: the pod waits for a batch pod to finish);
- ``warmgate``: ``idle_after: auto``, at ``warmgate-interactive`` (a cold start preempts batch).

Durations of a day are divided by ``compression`` (60: an hour in a minute). A cold start is not
(the demo engine loads in its own few seconds), and neither is a person's wait: so that
``idle_after: auto`` weighs a compressed gap as it would the gap of the day, a GPU-hour (and a
parked hour) is priced ``compression`` times the owner's (a compressed GPU-second holds the card
``compression`` seconds of the day), and a second of waiting at the owner's price."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from router.config.economics import Economics
from tests.deploy_tree import build
from tests.helpers import ROOT

from .access import apply_rbac
from .cluster import KubeCluster, new_api_client
from .flags import makes_token_secrets
from .gpus import GPU
from .kubelet import TestKubelet
from .workloads import ENGINE_PORT, deployment, engine_service

NODES = (("gpu-box", 4), ("warmgate-test-node", 1))
"""A 4-GPU training box and a 1-GPU workstation (the suite's own node name: a Node left by
another test is then one this kubelet runs, not a place where pods would wait forever)."""
UIS = {"comfyui": 12.0, "wan2gp": 30.0}
"""The render targets by deploy/'s names (its Role lets warmgate annotate only these) and the
GPU seconds of one render on each, uncompressed: an image UI, and a slower video one."""
POLICIES = ("always", "fixed", "warmgate")
WAITS = "interactive-waits"
"""The fixed policy's PriorityClass: ahead of batch in the queue, but it preempts nothing."""
CHECKPOINT_EVERY = 120.0
"""A batch pod checkpoints every 2 minutes (uncompressed): a preemption loses up to that."""
SLICES_PER_POD = 10
"""Slices before a batch pod completes and its Job makes the next (20 minutes of work)."""


PRICES = Economics()
"""The owner's prices: the defaults."""


def economics(compression: float, wait_compression: float = 1.0) -> dict[str, float]:
    """``economics:`` for a day whose GPU time runs ``compression`` times faster than the day's
    and whose waits ``wait_compression`` times (1: waits as measured)."""
    return {
        "gpu_hour_usd": PRICES.gpu_hour_usd * compression,
        "parked_hour_usd": PRICES.parked_hour_usd * compression,
        "cold_wait_usd_per_second": PRICES.cold_wait_usd_per_second * wait_compression,
    }


@dataclass
class DayLab:
    cluster: KubeCluster
    admin: client.ApiClient
    namespace: str
    workdir: Path
    policy: str
    compression: float
    slices_per_pod: int = SLICES_PER_POD
    kubelets: list[TestKubelet] = field(default_factory=list)

    @property
    def gpu_ledger(self) -> Path:
        return self.workdir / "gpus.jsonl"

    @property
    def batch_ledger(self) -> Path:
        return self.workdir / "batch.jsonl"

    def seconds(self, day_seconds: float) -> float:
        """A duration of the day, compressed."""
        return day_seconds / self.compression

    def duration(self, day_seconds: float) -> str:
        return f"{self.seconds(day_seconds):.3f}s"

    def config(self, kubeconfig: Path) -> dict[str, Any]:
        """warmgate's configuration for the policy (durations compressed)."""
        return {
            "listen": "127.0.0.1:0",
            "admin_listen": "127.0.0.1:0",
            "server": {"access_log": False, "drain_grace": "5s"},
            "economics": economics(self.compression),
            "targets": {name: self._target(name) for name in UIS},
        }

    def _target(self, name: str) -> dict[str, Any]:
        scaling: dict[str, Any] = {
            "cold_start_timeout": "120s",
            "expected_cold_start": "3s",
        }
        if self.policy == "always":
            scaling["idle_after"] = "24h"
        elif self.policy == "fixed":
            scaling["idle_after"] = self.duration(1800)
        else:
            scaling["idle_after"] = "auto"
            scaling["idle_bounds"] = [self.duration(120), self.duration(3600)]
        return {
            "engine": "comfyui",
            "routes": [{"path_prefix": f"/{name}", "strip_prefix": True}],
            "backend": {
                "kind": "kubernetes",
                "namespace": self.namespace,
                "deployment": name,
                "service": name,
                "port": ENGINE_PORT,
                "route_to": "pods",
            },
            "readiness": {"path": "/readyz", "interval": "100ms"},
            "scaling": scaling,
        }

    def render_deployment(self, name: str) -> dict[str, Any]:
        """The demo engine, one GPU, replicas 1 for ``always`` else 0."""
        render = self.seconds(UIS[name])
        container = {
            "name": "engine",
            "image": "local/demo-engine",
            "command": [sys.executable, "-m", "backends.demo_engine"],
            "args": ["--host", "{host}", "--port", "{port}", "--checkpoint-size", "4MiB",
                     "--checkpoint", str(self.workdir / f"{name}.ckpt"),
                     "--render-seconds", f"{render:.3f}"],
            "workingDir": str(ROOT),
            "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 1},
            "resources": {"limits": {GPU: 1}},
        }  # fmt: skip
        d = deployment(name, container, replicas=1 if self.policy == "always" else 0)
        pod = d["spec"]["template"]["spec"]
        pod["priorityClassName"] = WAITS if self.policy == "fixed" else "warmgate-interactive"
        pod["terminationGracePeriodSeconds"] = 5
        return d

    def batch_job(self, parallelism: int) -> dict[str, Any]:
        """More work than the cluster holds: ``parallelism`` pods at a time, one GPU each, each
        ``SLICES_PER_POD`` checkpointed slices, and completions enough for weeks."""
        argv = [sys.executable, "-m", "tests.kube.batch_worker", "--ledger", str(self.batch_ledger),
                "--slice", f"{self.seconds(CHECKPOINT_EVERY):.3f}",
                "--slices", str(self.slices_per_pod)]  # fmt: skip
        env = [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ]
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "trainer"},
            "spec": {
                "parallelism": parallelism,
                "completions": 100_000,
                "backoffLimit": 100_000,  # a preempted pod counts as failed from 1.26 on
                "template": {
                    "metadata": {"labels": {"app": "trainer"}},
                    "spec": {
                        "priorityClassName": "batch",
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 5,
                        "containers": [
                            {
                                "name": "train",
                                "image": "local/trainer",
                                "command": argv,
                                "workingDir": str(ROOT),
                                "env": env,
                                "resources": {"limits": {GPU: 1}},
                            }
                        ],
                    },
                },
            },
        }


async def priority_classes(admin: client.ApiClient) -> None:
    """deploy/'s PriorityClasses and the fixed policy's (cluster-wide: made once)."""
    scheduling = client.SchedulingV1Api(admin)
    classes = [o for o in build("base") if o["kind"] == "PriorityClass"]
    waits = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": WAITS},
        "value": 100000,
        "preemptionPolicy": "Never",
    }
    for obj in [*classes, waits]:
        obj["metadata"].pop("labels", None)
        with contextlib.suppress(ApiException):  # 409: made before
            await scheduling.create_priority_class(obj)


async def _default_account(core: client.CoreV1Api, namespace: str, token_secret: bool) -> None:
    """Pods may be made once the namespace's ``default`` ServiceAccount is there (and, before
    1.24, its token Secret): as fixtures.py waits for it."""
    async with asyncio.timeout(90):
        while True:
            with contextlib.suppress(ApiException):
                account = await core.read_namespaced_service_account("default", namespace)
                if account.secrets or not token_secret:
                    return
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def day_lab(
    cluster: KubeCluster,
    workdir: Path,
    policy: str,
    compression: float,
    namespace: str = "day",
    slices_per_pod: int = SLICES_PER_POD,
) -> AsyncIterator[DayLab]:
    """The nodes' kubelets, the namespace with deploy/'s RBAC, the render Deployments and the
    batch Job, on ``cluster``; the nodes are removed afterwards (the cluster may live on)."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    admin = await new_api_client(cluster.kubeconfig_path)
    lab = DayLab(cluster, admin, namespace, workdir, policy, compression, slices_per_pod)
    core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
    try:
        for node, gpus in NODES:
            api = await new_api_client(cluster.kubeconfig_path)
            kubelet = TestKubelet(
                api,
                node_name=node,
                log_dir=workdir / "pods",
                bind=not cluster.has_scheduler,
                gpus=gpus,
                gpu_ledger=lab.gpu_ledger,
            )
            lab.kubelets.append(kubelet)
            await kubelet.start()
        await core.create_namespace({"metadata": {"name": namespace}})
        await _default_account(core, namespace, makes_token_secrets(cluster.version))
        await apply_rbac(admin, namespace)
        await priority_classes(admin)
        for name in UIS:
            await apps.create_namespaced_deployment(namespace, lab.render_deployment(name))
            await core.create_namespaced_service(namespace, engine_service(name))
        gpus = sum(g for _, g in NODES)
        batch = client.BatchV1Api(admin)
        await batch.create_namespaced_job(namespace, lab.batch_job(gpus))
        yield lab
    finally:
        with contextlib.suppress(ApiException):
            await core.delete_namespace(namespace)
            await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        for kubelet in lab.kubelets:
            # Bounded: once a kubelet's stop waited forever on a cancelled pod task (seen
            # once in a day of 400 pods, not understood yet); the day's figures are taken.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(60):
                    await kubelet.stop()
            await kubelet.api.close()
        for node, _ in NODES:
            with contextlib.suppress(ApiException):
                await core.delete_node(node)
        await admin.close()
