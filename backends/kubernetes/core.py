"""Requests as ``RealKube`` (``backends.kubernetes.client``) makes them: raw responses read as
JSON with errors translated (:func:`checked_json`), their time limits, and the core API group
(``/api/v1``: pods, ConfigMaps), which the custom-objects calls cannot reach, asked by path
through the ``kubernetes_asyncio`` ApiClient itself.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from backends.kubernetes.api import Json, KubeError, Resource, Unreachable, error_for_status

REQUEST_TIMEOUT = 15.0
"""Seconds for one non-watch request: the API server answers these in milliseconds; a stuck
one must not hold a scale action for long."""
CONNECT_TIMEOUT = 5.0
WATCH_READ_SLACK = 30.0
"""A watch is given up as dead when nothing (not even its end) arrived this long after the
server should have closed it."""
MERGE_PATCH = "application/merge-patch+json"


def request_limits() -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=REQUEST_TIMEOUT, sock_connect=CONNECT_TIMEOUT)


def watch_limits(timeout_seconds: int) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(
        sock_connect=CONNECT_TIMEOUT, sock_read=timeout_seconds + WATCH_READ_SLACK
    )


async def checked_json(response: Any, what: str) -> Json:
    """The body of a raw response as JSON; an error status becomes a :class:`KubeError`."""
    try:
        async with response:
            body = await response.read()
            status = int(response.status)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise Unreachable(f"{what}: the API server did not answer: {exc!r}") from exc
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        data = {}
    if not 200 <= status < 300:
        message = data.get("message") if isinstance(data, dict) else None
        raise error_for_status(status, f"{what}: {message or f'HTTP {status}'}")
    if not isinstance(data, dict):
        raise KubeError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


def core_path(resource: Resource, namespace: str, name: str | None = None) -> str:
    path = f"/api/{resource.version}/namespaces/{namespace}/{resource.plural}"
    return f"{path}/{name}" if name is not None else path


class CoreGroup:
    """The core API group of one API server, by path."""

    def __init__(self, api: Any, server: str) -> None:
        self._api = api
        self._server = server

    async def request(
        self,
        what: str,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Json | None = None,
        limits: aiohttp.ClientTimeout | None = None,
    ) -> Any:
        """A raw response (its status is the caller's to check)."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = MERGE_PATCH if method == "PATCH" else "application/json"
        try:
            return await self._api.call_api(
                path,
                method,
                query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=limits or request_limits(),
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unreachable(f"{what}: API server {self._server} unreachable: {exc}") from exc

    async def call(
        self,
        what: str,
        method: str,
        resource: Resource,
        namespace: str,
        name: str | None = None,
        *,
        body: Json | None = None,
    ) -> Json:
        """One object's (or the collection's) answer as JSON; a PATCH is a merge patch."""
        path = core_path(resource, namespace, name)
        return await checked_json(await self.request(what, method, path, body=body), what)

    async def list(
        self,
        what: str,
        resource: Resource,
        namespace: str,
        label_selector: str | None,
        field_selector: str | None,
    ) -> Json:
        query = {"labelSelector": label_selector, "fieldSelector": field_selector}
        path = core_path(resource, namespace)
        return await checked_json(await self.request(what, "GET", path, query=query), what)

    async def watch(
        self,
        what: str,
        resource: Resource,
        namespace: str,
        resource_version: str,
        timeout_seconds: int,
        label_selector: str | None,
        field_selector: str | None,
    ) -> Any:
        """The raw response of a watch: line-delimited events (status unchecked)."""
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version or None,
            "timeoutSeconds": timeout_seconds,
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
        }
        path = core_path(resource, namespace)
        limits = watch_limits(timeout_seconds)
        return await self.request(what, "GET", path, query=query, limits=limits)
