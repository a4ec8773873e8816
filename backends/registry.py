"""The one place that turns config specs into concrete backends and engines.

The router calls these factories and then speaks only the protocols of ``backends.base``. What a
backend needs from warmgate's environment it is handed here as plain values (the router reads
the environment, in ``router/config/env.py``); no backend reads it itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from backends.base import Backend, Engine
from backends.cloud_api import Cloud
from backends.membership import Membership
from backends.specs import BackendSpec, EngineSpec, ReplicasSpec

if TYPE_CHECKING:
    from backends.engines.common import EngineBase


def make_backend(
    target: str,
    spec: BackendSpec,
    base_dir: str,
    *,
    environ: Mapping[str, str],
    kube_environ: Mapping[str, str],
) -> Backend:
    """``environ``: the base of a ``process`` child's environment; ``kube_environ``: the
    variables the ``kubernetes`` backend finds its credentials with."""
    if spec.kind == "static":
        from backends.static import StaticBackend

        return StaticBackend(spec)
    if spec.kind == "process":
        from backends.process import ProcessBackend

        return ProcessBackend(target, spec, base_dir, environ=environ)
    if spec.kind == "kubernetes":
        from backends.kubernetes import KubernetesBackend
        from backends.kubernetes.client import connector

        return KubernetesBackend(target, spec, connect=connector(kube_environ))
    raise ValueError(f"unknown backend kind {spec.kind!r}")  # config validation prevents this


def make_membership(
    spec: ReplicasSpec,
    *,
    kube_environ: Mapping[str, str],
    pod_name: str | None = None,
    pod_ip: str | None = None,
) -> Membership:
    """Several warmgate replicas: peers from the EndpointSlices, leadership from a Lease.
    ``pod_name`` and ``pod_ip``: this pod's, from the Downward API (``$POD_NAME``, ``$POD_IP``)."""
    from backends.kubernetes import KubernetesMembership
    from backends.kubernetes.client import connector
    from backends.kubernetes.membership import own_identity

    return KubernetesMembership(
        spec,
        connect=connector(kube_environ),
        identity=own_identity(spec, pod_name),
        own_address=pod_ip,
    )


def make_engine(spec: EngineSpec, backend: Backend | None = None) -> Engine:
    """``backend``: the target's, asked where readiness is probed with ``readiness.port:
    "{ready_port}"``."""
    from backends.engines.common import readiness_at

    engine = _engine(spec)
    engine.ready_at = readiness_at(spec.readiness, backend)
    return engine


def _engine(spec: EngineSpec) -> EngineBase:
    if spec.kind == "http":
        from backends.engines.http import HttpEngine

        return HttpEngine(spec)
    if spec.kind == "comfyui":
        from backends.engines.comfyui import ComfyUIEngine

        return ComfyUIEngine(spec)
    if spec.kind == "gradio":
        from backends.engines.gradio import GradioEngine

        return GradioEngine(spec)
    if spec.kind == "openai":
        from backends.engines.openai_compat import OpenAIEngine

        return OpenAIEngine(spec)
    raise ValueError(f"unknown engine {spec.kind!r}")  # config validation prevents this


def make_cloud(name: str, base_url: str, api_key: str, timeout: float) -> Cloud:
    """A managed OpenAI-compatible service (``backends.cloud``, the only importer of openai)."""
    from backends.cloud import OpenAICloud

    return OpenAICloud(name, base_url, api_key, timeout)
