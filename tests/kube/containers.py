"""Pods whose container the test kubelet runs from a locally built image, with podman.

A pod annotated ``warmgate.test/runtime: podman`` has its first container run as
``podman run`` in the foreground (the kubelet supervises that process as it does a local one):
its image as built on this machine (nothing is pulled), ``command``/``args`` as the entrypoint
and command, the pod's ``env`` (values and the Downward API fields), ``runAsUser`` and
``readOnlyRootFilesystem``, and its volumes written out as a kubelet would and mounted where
the container asks: ConfigMaps, Secrets, the projected ServiceAccount token (a TokenRequest),
its CA and namespace, emptyDirs. The network is the test process's (the pod network of
netns.py), so the container listens on the pod's address; ``KUBERNETES_SERVICE_HOST`` and
``_PORT`` name the API server as the kubelet reaches it (no Service proxy runs here).

Files are written readable by every user: a real kubelet gives them to the pod's fsGroup.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

RUNTIME = "warmgate.test/runtime"
Json = dict[str, Any]


def runs_in_podman(pod: Json) -> bool:
    return (pod["metadata"].get("annotations") or {}).get(RUNTIME) == "podman"


def container_name(pod: Json) -> str:
    return f"warmgate-pod-{pod['metadata']['uid'][:13]}"


class Volumes:
    """Writes a pod's volumes under ``root``, one folder each."""

    def __init__(self, api: client.ApiClient, pod: Json, root: Path) -> None:
        self.core = client.CoreV1Api(api)
        self.api = api
        self.pod = pod
        self.namespace = pod["metadata"]["namespace"]
        self.root = root

    async def write(self) -> dict[str, Path]:
        made = {}
        for volume in self.pod["spec"].get("volumes") or []:
            folder = self.root / volume["name"]
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o755)
            for name, data in (await self._files(volume)).items():
                path = folder / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                path.chmod(0o644)
            made[volume["name"]] = folder
        return made

    async def _files(self, volume: Json) -> dict[str, bytes]:
        if "configMap" in volume:
            return await self._config_map(volume["configMap"])
        if "secret" in volume:
            source = volume["secret"]
            secret = await self.core.read_namespaced_secret(source["secretName"], self.namespace)
            data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
            return _items(data, source.get("items"))
        if "projected" in volume:
            files: dict[str, bytes] = {}
            for source in volume["projected"].get("sources") or []:
                files.update(await self._projected(source))
            return files
        return {}  # emptyDir and the like: an empty folder

    async def _config_map(self, source: Json) -> dict[str, bytes]:
        try:
            cm = await self.core.read_namespaced_config_map(source["name"], self.namespace)
            data = {k: v.encode() for k, v in (cm.data or {}).items()}
        except ApiException as exc:
            if exc.status != 404 or source["name"] != "kube-root-ca.crt":
                raise
            # Published by a controller the test cluster does not run: the CA it would hold.
            data = {"ca.crt": _read(self.api.configuration.ssl_ca_cert)}
        return _items(data, source.get("items"))

    async def _projected(self, source: Json) -> dict[str, bytes]:
        if "serviceAccountToken" in source:
            spec = source["serviceAccountToken"]
            account = self.pod["spec"].get("serviceAccountName") or "default"
            request = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": [spec["audience"]] if spec.get("audience") else None,
                    "expirationSeconds": spec.get("expirationSeconds") or 3607,
                },
            }
            made = await self.core.create_namespaced_service_account_token(
                account, self.namespace, request
            )
            return {spec["path"]: made.status.token.encode()}
        if "configMap" in source:
            return await self._config_map(source["configMap"])
        if "secret" in source:
            return await self._files(
                {"secret": {"secretName": source["secret"]["name"], **source["secret"]}}
            )
        if "downwardAPI" in source:
            fields = {
                "metadata.namespace": self.namespace,
                "metadata.name": self.pod["metadata"]["name"],
            }
            return {
                item["path"]: fields[item["fieldRef"]["fieldPath"]].encode()
                for item in source["downwardAPI"].get("items") or []
            }
        return {}


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _items(data: dict[str, bytes], items: list[Json] | None) -> dict[str, bytes]:
    if not items:
        return data
    return {item["path"]: data[item["key"]] for item in items if item["key"] in data}


async def podman_argv(
    api: client.ApiClient, pod: Json, container: Json, env: dict[str, str], root: Path
) -> list[str]:
    """``podman run`` for the container, its volumes written under ``root``."""
    volumes = await Volumes(api, pod, root).write()
    server = urlsplit(api.configuration.host)
    security = {
        **(pod["spec"].get("securityContext") or {}),
        **(container.get("securityContext") or {}),
    }
    argv = ["podman", "run", "--rm", "--name", container_name(pod), "--network", "host"]
    if security.get("runAsUser") is not None:
        argv += ["--user", str(security["runAsUser"])]
    if security.get("readOnlyRootFilesystem"):
        argv.append("--read-only")
    for mount in container.get("volumeMounts") or []:
        mode = ":ro" if mount.get("readOnly") else ""
        argv += ["-v", f"{volumes[mount['name']]}:{mount['mountPath']}{mode}"]
    service = {
        "KUBERNETES_SERVICE_HOST": server.hostname or "",
        "KUBERNETES_SERVICE_PORT": str(server.port),
    }
    for name, value in {**service, **env}.items():
        argv += ["-e", f"{name}={value}"]
    if container.get("command"):
        argv += ["--entrypoint", container["command"][0]]
    argv.append(container["image"])
    argv += [*container.get("command", [])[1:], *(container.get("args") or [])]
    return argv


def podman_env() -> dict[str, str]:
    """podman's own environment: this process's (CONTAINERS_CONF included)."""
    return dict(os.environ)
