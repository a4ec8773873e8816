"""Pod and Node statuses as a kubelet writes them, and the command line it runs, for the test
kubelet: pure functions of what it knows (the pod, its address, the container's state), so the
phases of a start look to the API server and to warmgate as they do on a real node.

A real kubelet shows an image being pulled as the waiting reason ``ContainerCreating``, a pull
that fails as ``ErrImagePull`` then ``ImagePullBackOff``, and a container that keeps exiting as
``CrashLoopBackOff`` (with its last termination), the pod ``Running`` all along.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from .netns import node_address

Json = dict[str, Any]

BAD_IMAGE = "warmgate.test/bad"
"""Images named like this cannot be pulled (``warmgate.test/bad:1`` -> ``ErrImagePull``)."""
PULL_SECONDS = "warmgate.test/pull-seconds"
"""A pod annotation: seconds its image pull takes (``ContainerCreating`` meanwhile)."""
CRASH_LOOP_AFTER = 2
"""Exits of a container before its waiting reason says ``CrashLoopBackOff`` (a real kubelet
restarts the first exit at once and backs off from the second)."""


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def waiting(reason: str, message: str = "") -> Json:
    """A container state: only one of the three keys is set, the others are cleared (a status
    patch merges maps, so a key left out would survive from the previous state)."""
    return {"waiting": {"reason": reason, "message": message}, "running": None, "terminated": None}


def running(started_at: str) -> Json:
    return {"waiting": None, "running": {"startedAt": started_at}, "terminated": None}


def terminated(code: int, message: str = "", reason: str = "Error") -> Json:
    finished = {"exitCode": code, "reason": reason, "message": message, "finishedAt": now()}
    return {"waiting": None, "running": None, "terminated": finished}


def pod_status(
    pod: Json,
    host: str | None,
    *,
    phase: str,
    ready: bool,
    state: Json,
    restarts: int = 0,
    last_state: Json | None = None,
) -> Json:
    """The whole status of a pod with one container; ``host``: its address once it has one."""
    c = pod["spec"]["containers"][0]
    at, flag = now(), "True" if ready else "False"
    started = state.get("running") is not None
    status: Json = {
        "phase": phase,
        "hostIP": node_address(),
        "startTime": (pod.get("status") or {}).get("startTime") or at,
        "conditions": [
            {"type": t, "status": s, "lastTransitionTime": at}
            for t, s in (
                ("Initialized", "True"),
                ("PodScheduled", "True"),
                ("ContainersReady", flag),
                ("Ready", flag),
            )
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image") or "",
                "imageID": f"local://{c.get('image') or ''}" if started else "",
                "ready": ready,
                "restartCount": restarts,
                "started": started,
                "state": state,
                "lastState": last_state or {"waiting": None, "running": None, "terminated": None},
            }
        ],
    }
    if host is not None:
        status.update(podIP=host, podIPs=[{"ip": host}])
    return status


def pull_seconds(pod: Json) -> float:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        return max(0.0, float(annotations.get(PULL_SECONDS) or 0))
    except ValueError:
        return 0.0


def bad_image(pod: Json) -> str | None:
    """The image when it is one that cannot be pulled."""
    image = str(pod["spec"]["containers"][0].get("image") or "")
    return image if image.startswith(BAD_IMAGE) else None


def node_status(name: str, gpus: int) -> Json:
    """A Ready Node with room for everything but GPUs: ``gpus`` of ``nvidia.com/gpu``, an
    extended resource, so the scheduler places GPU pods by it (and preempts for it)."""
    at = now()
    resources = {"cpu": "64", "memory": "256Gi", "pods": "1000", "nvidia.com/gpu": str(gpus)}
    return {
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "lastHeartbeatTime": at,
                "lastTransitionTime": at,
            }
        ],
        "addresses": [
            {"type": "InternalIP", "address": node_address()},
            {"type": "Hostname", "address": name},
        ],
        "capacity": resources,
        "allocatable": resources,
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": "",
            "osImage": "",
            "containerRuntimeVersion": "local://",
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": "v1.20.2",
            "kubeProxyVersion": "",
        },
    }


def probe_port(container: Json, probe: Json | None) -> int | None:
    """The port a readinessProbe ``httpGet`` names (a number, or a container port's name)."""
    if not probe:
        return None
    port = probe.get("port")
    if isinstance(port, int):
        return port
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    return int(str(port)) if str(port).isdigit() else None


def _subst(s: str, host: str, port: int) -> str:
    return s.replace("{host}", host).replace("{port}", str(port))


def command_line(
    pod: Json, container: Json, host: str, port: int, node: str
) -> tuple[list[str], dict[str, str]]:
    """The container's ``command + args`` and its environment over this process's, with
    ``{host}`` and ``{port}`` filled in and the Downward API's fields a pod may ask for."""
    argv = [
        _subst(a, host, port)
        for a in (container.get("command") or []) + (container.get("args") or [])
    ]
    return argv, {**os.environ, **pod_env(pod, container, host, port, node)}


def pod_env(pod: Json, container: Json, host: str, port: int, node: str) -> dict[str, str]:
    """The container's own ``env``: values, and the Downward API's fields."""
    meta = pod["metadata"]
    fields = {
        "status.podIP": host,
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "spec.nodeName": node,
    }
    env = {}
    for e in container.get("env") or []:
        ref = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        env[e["name"]] = fields.get(ref, "") if ref else _subst(e.get("value") or "", host, port)
    return env
