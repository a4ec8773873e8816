"""From the watched objects to an :class:`~backends.base.Observation`, and the checks made
before warmgate may own a Deployment's replica count. Pure functions of JSON objects."""

from __future__ import annotations

from collections.abc import Iterable

from backends.base import Observation, Rollout
from backends.kubernetes.api import Json
from backends.kubernetes.stages import start_stage, unready_addresses
from backends.specs import KubernetesSpec


def spec_replicas(deployment: Json | None) -> int:
    """The Deployment's asked-for replicas (the API server defaults it, so absent is rare)."""
    if deployment is None:
        return 0
    return int((deployment.get("spec") or {}).get("replicas") or 0)


def ready_addresses(slices: Iterable[Json]) -> list[str]:
    """Addresses of ready endpoints, in a stable order. ``ready`` absent means unknown, which
    consumers are told to treat as ready; a terminating endpoint is never ready."""
    found: set[str] = set()
    for slice_ in slices:
        if slice_.get("addressType", "IPv4") not in ("IPv4", "IPv6"):
            continue  # FQDN slices name no pod
        for endpoint in slice_.get("endpoints") or ():
            conditions = endpoint.get("conditions") or {}
            if conditions.get("ready") is False or conditions.get("terminating") is True:
                continue
            found.update(str(a) for a in endpoint.get("addresses") or ())
    return sorted(found, key=_address_key)


def _address_key(address: str) -> tuple[int, ...] | tuple[int, str]:
    if ":" not in address and address.replace(".", "").isdigit():
        return tuple(int(part) for part in address.split("."))
    return (1 << 16, address)


def endpoint_urls(spec: KubernetesSpec, addresses: list[str]) -> tuple[str, ...]:
    """Where requests go: each ready pod, or the Service's name once one pod is ready."""
    if not addresses:
        return ()
    if spec.route_to == "service":
        port = spec.service_port or spec.port
        return (f"http://{spec.service_name}.{spec.namespace}.svc:{port}",)
    return pod_urls(spec, addresses)


def pod_urls(spec: KubernetesSpec, addresses: list[str]) -> tuple[str, ...]:
    """Each pod's own base URL (its address and the container port), as the kubelet reaches it."""
    return tuple(
        f"http://[{a}]:{spec.port}" if ":" in a else f"http://{a}:{spec.port}" for a in addresses
    )


def replica_failure(deployment: Json | None) -> str | None:
    """Why the Deployment cannot create its pods (quota, admission), from its ``ReplicaFailure``
    condition; only trusted once the controller has seen the current spec."""
    if deployment is None:
        return None
    status = deployment.get("status") or {}
    generation = (deployment.get("metadata") or {}).get("generation")
    if generation is not None and status.get("observedGeneration") != generation:
        return None
    for condition in status.get("conditions") or ():
        if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
            return f"cannot create pods: {condition.get('message') or condition.get('reason')}"
    return None


def images(pod_spec: Json | None) -> str:
    """The images a pod spec runs, in order (its containers')."""
    containers = (pod_spec or {}).get("containers") or ()
    return ", ".join(str(c.get("image") or "?") for c in containers)


def _ready(pod: Json) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def rollout(deployment: Json | None, pods: Iterable[Json] | None) -> Rollout | None:
    """The pod template's image(s) against the ready pods' (``None``: no Deployment, or no
    container in its template)."""
    if deployment is None:
        return None
    template = ((deployment.get("spec") or {}).get("template") or {}).get("spec")
    declared = images(template)
    if not declared:
        return None
    status = deployment.get("status") or {}
    replicas = spec_replicas(deployment)
    ready_pods = [pod for pod in pods or () if _ready(pod)]
    running = sorted({images(pod.get("spec")) for pod in ready_pods})
    on_declared = sum(1 for pod in ready_pods if images(pod.get("spec")) == declared)
    generation = (deployment.get("metadata") or {}).get("generation")
    seen = generation is None or status.get("observedGeneration") == generation
    updated = int(status.get("updatedReplicas") or 0)
    settled = (
        seen
        and replicas > 0
        and updated >= replicas
        and on_declared >= replicas
        and len(ready_pods) == on_declared
    )
    return Rollout(declared, " | ".join(running), updated, on_declared, replicas, settled)


def observe(
    spec: KubernetesSpec,
    deployment: Json | None,
    slices: Iterable[Json],
    *,
    intent: int | None = None,
    problems: Iterable[str] = (),
    refused: str | None = None,
    pods: Iterable[Json] | None = None,
) -> Observation:
    """``intent``: the replica count warmgate asked for and has not seen confirmed yet (it
    counts over the watched value, so a scale-down does not look running until the watch
    catches up). ``problems``: why the view may be stale (degraded, but serving goes on).
    ``pods``: the Deployment's pods, for the stage of a start (``None``: not watched)."""
    replicas = intent if intent is not None else spec_replicas(deployment)
    running = replicas > 0
    endpoints = endpoint_urls(spec, ready_addresses(slices)) if running else ()
    failure = refused or (replica_failure(deployment) if running else None)
    degraded = "; ".join(problems) or None
    pods = None if pods is None else list(pods)
    version = rollout(deployment, pods)
    if not running or pods is None:
        return Observation(
            running=running,
            endpoints=endpoints,
            failure=failure,
            degraded=degraded,
            rollout=version,
        )
    stage = start_stage(pods)
    if failure is None and stage.failure_reason is not None:
        failure = f"{stage.failure_reason}: {stage.message}"
    # Until a pod is ready, its engine is asked on the pod itself for its own words (a failed
    # load, its progress): its readiness probe failing tells only "not yet".
    unready = () if endpoints else pod_urls(spec, unready_addresses(pods))
    return Observation(
        running=running,
        endpoints=endpoints,
        failure=failure,
        degraded=degraded,
        stage=stage.stage,
        stage_message=stage.message if stage.failure_reason is None else "",
        failure_reason=stage.failure_reason if failure is not None else None,
        rollout=version,
        probe_only=unready,
    )


def other_owners(
    spec: KubernetesSpec, hpas: Iterable[Json], scaled_objects: Iterable[Json]
) -> list[str]:
    """HPAs and KEDA ScaledObjects that also scale the Deployment: two owners of one replica
    count flap it, so direct mode refuses to start next to any of them."""
    owners = []
    for hpa in hpas:
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        if ref.get("kind") == "Deployment" and ref.get("name") == spec.deployment:
            owners.append(f"HorizontalPodAutoscaler {hpa['metadata']['name']}")
    for scaled in scaled_objects:
        ref = (scaled.get("spec") or {}).get("scaleTargetRef") or {}
        if ref.get("kind", "Deployment") == "Deployment" and ref.get("name") == spec.deployment:
            owners.append(f"KEDA ScaledObject {scaled['metadata']['name']}")
    return owners
