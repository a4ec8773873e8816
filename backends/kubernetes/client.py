"""``RealKube``: :class:`backends.kubernetes.api.KubeApi` over ``kubernetes_asyncio``, and how
warmgate finds its credentials. The only module that talks to the library; its errors are
translated into :mod:`backends.kubernetes.api`'s tree here, at the boundary.

Requests go out with ``_preload_content=False``: objects stay plain JSON (no model classes, no
deserialization cost), and a watch is a line-delimited JSON stream read as it arrives.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.config.config_exception import ConfigException

from backends.kubernetes.api import (
    Json,
    KubeApi,
    KubeError,
    ObjectList,
    Resource,
    Unreachable,
    WatchEvent,
    error_for_status,
)
from backends.kubernetes.core import (
    MERGE_PATCH,
    CoreGroup,
    checked_json,
    request_limits,
    watch_limits,
)
from backends.kubernetes.refusals import SteadyRefusals

SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class Access:
    """Where the credentials come from: the pod's ServiceAccount, or a kubeconfig file."""

    kind: Literal["in-cluster", "kubeconfig"]
    host: str = ""
    """In-cluster: ``https://<KUBERNETES_SERVICE_HOST>:<KUBERNETES_SERVICE_PORT>``."""
    serviceaccount_dir: Path = SERVICEACCOUNT_DIR
    kubeconfig: Path | None = None

    def describe(self) -> str:
        if self.kind == "in-cluster":
            return f"in-cluster ServiceAccount ({self.serviceaccount_dir})"
        return f"kubeconfig {self.kubeconfig}"


def resolve_access(
    environ: Mapping[str, str], serviceaccount_dir: Path = SERVICEACCOUNT_DIR
) -> Access:
    """In-cluster config when running in a pod (service host set and a token mounted), else the
    first file of ``KUBECONFIG``, else ``~/.kube/config``. Pure: the variables are passed in
    (``router.config.env`` reads them, once)."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if host and port and (serviceaccount_dir / "token").is_file():
        bracketed = f"[{host}]" if ":" in host else host
        return Access(
            "in-cluster", host=f"https://{bracketed}:{port}", serviceaccount_dir=serviceaccount_dir
        )
    paths = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if paths:
        return Access("kubeconfig", kubeconfig=Path(paths[0]).expanduser())
    home = environ.get("HOME") or str(Path.home())
    return Access("kubeconfig", kubeconfig=Path(home, ".kube", "config"))


def connector(environ: Mapping[str, str]) -> Callable[[], Awaitable[KubeApi]]:
    """How the backend and the replicas connect: credentials resolved from ``environ`` (the
    variables of ``resolve_access``) at each connect, so a token mounted late is still found."""

    async def connect_with_environment() -> KubeApi:
        return await connect(resolve_access(environ))

    return connect_with_environment


async def connect(access: Access) -> KubeApi:
    """An API client for ``access``; a missing or unusable config is a :class:`KubeError`. A
    401/403 from an API server that is starting is told from RBAC's (``refusals``)."""
    configuration = k8s.Configuration()
    try:
        if access.kind == "in-cluster":
            d = access.serviceaccount_dir
            host, _, port = access.host.removeprefix("https://").rpartition(":")
            loader = k8s_config.incluster_config.InClusterConfigLoader(
                token_filename=str(d / "token"),
                cert_filename=str(d / "ca.crt"),
                environ={
                    "KUBERNETES_SERVICE_HOST": host.strip("[]"),
                    "KUBERNETES_SERVICE_PORT": port,
                },
            )
            loader.load_and_set(configuration)
        else:
            if access.kubeconfig is None or not access.kubeconfig.is_file():
                raise KubeError(
                    f"no Kubernetes credentials: not in a pod (no ServiceAccount token) and "
                    f"no kubeconfig at {access.kubeconfig} (set KUBECONFIG)"
                )
            await k8s_config.load_kube_config(
                config_file=str(access.kubeconfig),
                client_configuration=configuration,
                persist_config=False,
            )
    except (ConfigException, OSError, ValueError) as exc:
        raise KubeError(f"cannot use {access.describe()}: {exc}") from exc
    real = RealKube(k8s.ApiClient(configuration=configuration), str(configuration.host))
    return SteadyRefusals(real, real.ready)


def _params(**params: Any) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}


class RealKube:
    """The API server behind a ``kubernetes_asyncio`` ApiClient. Custom-objects calls reach
    every API group; the core group (pods, ConfigMaps) is asked by path."""

    def __init__(self, api: Any, server: str) -> None:
        self._api = api
        self._server = server
        self._custom = k8s.CustomObjectsApi(api)
        self._apps = k8s.AppsV1Api(api)
        self._apis = k8s.ApisApi(api)
        self._core = CoreGroup(api, server)

    @property
    def server(self) -> str:
        return self._server

    async def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Json:
        try:
            response = await method(
                *args,
                _preload_content=False,
                _request_timeout=request_limits(),
                **kwargs,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unreachable(f"{what}: API server {self._server} unreachable: {exc}") from exc
        return await checked_json(response, what)

    async def ready(self) -> bool:
        """False while /readyz says the API server is not ready (a 5xx, or no answer). A 401/403
        there tells nothing (credentials refused for /readyz too): taken as ready, so that a
        token refused for good is reported, not retried forever."""
        try:
            response = await self._core.request("readyz", "GET", "/readyz")
        except Unreachable:
            return False
        async with response:
            return int(response.status) < 500

    async def group_versions(self, group: str) -> tuple[str, ...]:
        data = await self._call("discovery", self._apis.get_api_versions)
        for entry in data.get("groups") or ():
            if entry.get("name") == group:
                preferred = (entry.get("preferredVersion") or {}).get("version")
                versions = [v.get("version") for v in entry.get("versions") or ()]
                ordered = [preferred] if preferred in versions else []
                return tuple(str(v) for v in ordered + [v for v in versions if v != preferred])
        return ()

    async def list(
        self,
        resource: Resource,
        namespace: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        what = f"list {resource} in namespace {namespace}"
        if not resource.group:
            data = await self._core.list(what, resource, namespace, label_selector, field_selector)
        else:
            data = await self._call(
                what,
                self._custom.list_namespaced_custom_object,
                resource.group,
                resource.version,
                namespace,
                resource.plural,
                **_params(label_selector=label_selector, field_selector=field_selector),
            )
        items = tuple(item for item in data.get("items") or () if isinstance(item, dict))
        return ObjectList(items, str((data.get("metadata") or {}).get("resourceVersion", "")))

    @asynccontextmanager
    async def watch(
        self,
        resource: Resource,
        namespace: str,
        *,
        resource_version: str,
        timeout_seconds: int,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        what = f"watch {resource} in namespace {namespace}"
        if not resource.group:
            response = await self._core.watch(
                what,
                resource,
                namespace,
                resource_version,
                timeout_seconds,
                label_selector,
                field_selector,
            )
        else:
            response = await self._custom_watch(
                what,
                resource,
                namespace,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                label_selector=label_selector,
                field_selector=field_selector,
            )
        if not 200 <= int(response.status) < 300:
            await checked_json(response, what)  # raises the translated error
        try:
            yield self._events(response, what)
        finally:
            response.close()

    async def _custom_watch(
        self,
        what: str,
        resource: Resource,
        namespace: str,
        *,
        resource_version: str,
        timeout_seconds: int,
        label_selector: str | None,
        field_selector: str | None,
    ) -> Any:
        try:
            return await self._custom.list_namespaced_custom_object(
                resource.group,
                resource.version,
                namespace,
                resource.plural,
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                _preload_content=False,
                _request_timeout=watch_limits(timeout_seconds),
                **_params(label_selector=label_selector, field_selector=field_selector),
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unreachable(f"{what}: API server {self._server} unreachable: {exc}") from exc

    async def _events(self, response: Any, what: str) -> AsyncIterator[WatchEvent]:
        try:
            while line := await response.content.readline():
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError as exc:
                    raise Unreachable(f"{what}: a broken event line: {exc}") from exc
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    code = int(obj.get("code") or 0)
                    raise error_for_status(code, f"{what}: {obj.get('message') or code}")
                if kind in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
                    yield WatchEvent(kind, obj)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise Unreachable(f"{what}: the watch broke: {exc!r}") from exc

    async def get(self, resource: Resource, namespace: str, name: str) -> Json:
        what = f"get {resource} {name} in namespace {namespace}"
        if not resource.group:
            return await self._core.call(what, "GET", resource, namespace, name)
        return await self._call(
            what,
            self._custom.get_namespaced_custom_object,
            resource.group,
            resource.version,
            namespace,
            resource.plural,
            name,
        )

    async def create(self, resource: Resource, namespace: str, body: Json) -> Json:
        name = (body.get("metadata") or {}).get("name")
        what = f"create {resource} {name} in namespace {namespace}"
        if not resource.group:
            return await self._core.call(what, "POST", resource, namespace, body=body)
        return await self._call(
            what,
            self._custom.create_namespaced_custom_object,
            resource.group,
            resource.version,
            namespace,
            resource.plural,
            body,
        )

    async def replace(self, resource: Resource, namespace: str, body: Json) -> Json:
        name = str((body.get("metadata") or {}).get("name"))
        what = f"update {resource} {name} in namespace {namespace}"
        if not resource.group:
            return await self._core.call(what, "PUT", resource, namespace, name, body=body)
        return await self._call(
            what,
            self._custom.replace_namespaced_custom_object,
            resource.group,
            resource.version,
            namespace,
            resource.plural,
            name,
            body,
        )

    async def patch(self, resource: Resource, namespace: str, name: str, body: Json) -> Json:
        what = f"patch {resource} {name} in namespace {namespace}"
        if not resource.group:
            return await self._core.call(what, "PATCH", resource, namespace, name, body=body)
        return await self._call(
            what,
            self._custom.patch_namespaced_custom_object,
            resource.group,
            resource.version,
            namespace,
            resource.plural,
            name,
            body,
            _content_type=MERGE_PATCH,
        )

    async def get_scale(self, namespace: str, deployment: str) -> int:
        data = await self._call(
            f"get deployments/{deployment}/scale in namespace {namespace}",
            self._apps.read_namespaced_deployment_scale,
            deployment,
            namespace,
        )
        return int((data.get("spec") or {}).get("replicas") or 0)

    async def patch_scale(self, namespace: str, deployment: str, replicas: int) -> int:
        data = await self._call(
            f"patch deployments/{deployment}/scale in namespace {namespace}",
            self._apps.patch_namespaced_deployment_scale,
            deployment,
            namespace,
            {"spec": {"replicas": replicas}},
            _content_type=MERGE_PATCH,
        )
        return int((data.get("spec") or {}).get("replicas") or 0)

    async def close(self) -> None:
        await self._api.close()
