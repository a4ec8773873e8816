"""Where a start of a Deployment is, read from its pods: the stage, in the cluster's own words,
and the waits that can never end by themselves (a bad image, a crash loop), which fail the
start at once instead of at ``cold_start_timeout``. Pure functions of JSON objects.

A real kubelet reports an image pull as the waiting reason ``ContainerCreating`` (the pull is
most of that time for a render image of several GiB); the scheduler says why a pod has no
node in its ``PodScheduled`` condition, and names the node where it evicts lower-priority pods
for it in ``status.nominatedNodeName``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from backends.base import STAGES, Stage
from backends.kubernetes.api import Json

TERMINAL_WAITS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
"""Waiting reasons of a container that will not start as it is: the image cannot be pulled,
the container keeps exiting, or its config cannot be made (a missing Secret or ConfigMap)."""


@dataclass(frozen=True, slots=True)
class PodStage:
    stage: Stage | None
    """``None``: the pod is ready (nothing to wait for)."""
    message: str = ""
    failure_reason: str | None = None
    """A terminal wait (:data:`TERMINAL_WAITS`); ``message`` then says what the kubelet said."""


def label_selector(selector: Mapping[str, Any] | None) -> str | None:
    """A Deployment's ``spec.selector`` as a label selector string (``None``: it has none)."""
    if not selector:
        return None
    terms = [f"{k}={v}" for k, v in sorted(dict(selector.get("matchLabels") or {}).items())]
    for expression in selector.get("matchExpressions") or ():
        key, op = expression.get("key"), expression.get("operator")
        values = ",".join(str(v) for v in expression.get("values") or ())
        if op == "In":
            terms.append(f"{key} in ({values})")
        elif op == "NotIn":
            terms.append(f"{key} notin ({values})")
        elif op == "Exists":
            terms.append(str(key))
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
    return ",".join(terms) or None


def _condition(status: Json, kind: str) -> Json:
    for condition in status.get("conditions") or ():
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def _waits(status: Json) -> Iterable[tuple[Json, Json]]:
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or ():
            waiting = (container.get("state") or {}).get("waiting")
            if waiting:
                yield container, waiting


def pod_stage(pod: Json) -> PodStage:
    """The stage of one pod that is not terminating."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    for _, waiting in _waits(status):
        reason = str(waiting.get("reason") or "")
        if reason in TERMINAL_WAITS:
            said = waiting.get("message") or reason
            return PodStage("starting", said, failure_reason=reason)
    if not spec.get("nodeName"):
        scheduled = _condition(status, "PodScheduled")
        nominated = status.get("nominatedNodeName")
        if nominated:
            return PodStage("preempting", f"evicting lower-priority pods on node {nominated}")
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            return PodStage("unschedulable", str(scheduled.get("message") or "no node fits"))
        return PodStage("scheduling")
    statuses = status.get("containerStatuses") or ()
    if not statuses:
        return PodStage("pulling")  # bound: the kubelet makes the sandbox and pulls
    for container, waiting in _waits(status):
        if waiting.get("reason") == "ContainerCreating" and not container.get("imageID"):
            return PodStage("pulling", f"pulling {container.get('image') or 'the image'}")
    for container in statuses:
        if not (container.get("state") or {}).get("running") or container.get("started") is False:
            return PodStage("starting")
    if _condition(status, "Ready").get("status") == "True":
        return PodStage(None)
    return PodStage("loading")


def _live(pod: Json) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return not meta.get("deletionTimestamp") and status.get("phase") not in ("Succeeded", "Failed")


def start_stage(pods: Iterable[Json]) -> PodStage:
    """The start as a whole: failed when any pod waits for good; else the furthest pod's stage
    (``scheduling`` before a pod exists)."""
    stages = [pod_stage(pod) for pod in pods if _live(pod)]
    for found in stages:
        if found.failure_reason is not None:
            return found
    waiting = [s for s in stages if s.stage is not None]
    if not waiting:
        return PodStage("scheduling") if not stages else PodStage(None)
    return max(waiting, key=lambda s: STAGES.index(s.stage) if s.stage else -1)


def unready_addresses(pods: Iterable[Json]) -> list[str]:
    """The addresses of live pods whose containers all run but which are not ready (their
    readiness probe fails: the engine loads, or says it cannot): where the engine's own
    readiness answer is read while a start waits. Only a well-formed IP address counts (it
    becomes a URL warmgate connects to)."""
    found = []
    for pod in pods:
        status = pod.get("status") or {}
        statuses = status.get("containerStatuses") or ()
        if not _live(pod) or not statuses or _condition(status, "Ready").get("status") == "True":
            continue
        if not all((c.get("state") or {}).get("running") for c in statuses):
            continue
        try:
            found.append(str(ipaddress.ip_address(str(status.get("podIP") or ""))))
        except ValueError:
            continue
    return sorted(set(found))
