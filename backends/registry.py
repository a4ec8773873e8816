"""The one place that turns config specs into concrete backends and engines.

The router calls these factories and then speaks only the protocols of ``backends.base``.
"""

from __future__ import annotations

from backends.base import Backend, Cloud, Engine, Membership
from backends.specs import BackendSpec, EngineSpec, ReplicasSpec


def make_backend(target: str, spec: BackendSpec, base_dir: str) -> Backend:
    if spec.kind == "static":
        from backends.static import StaticBackend

        return StaticBackend(spec)
    if spec.kind == "process":
        from backends.process import ProcessBackend

        return ProcessBackend(target, spec, base_dir)
    if spec.kind == "kubernetes":
        from backends.kubernetes import KubernetesBackend

        return KubernetesBackend(target, spec)
    raise ValueError(f"unknown backend kind {spec.kind!r}")  # config validation prevents this


def make_membership(spec: ReplicasSpec) -> Membership:
    """Several warmgate replicas: peers from the EndpointSlices, leadership from a Lease."""
    from backends.kubernetes import KubernetesMembership

    return KubernetesMembership(spec)


def make_engine(spec: EngineSpec) -> Engine:
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
