"""Where warmgate keeps what it must not forget at a restart, in the cluster itself
(:class:`backends.documents.StateStore`):

- a target's own documents (its learned cold-start figures) as annotations
  ``warmgate.io/<key>`` on its Deployment: every replica and every restart shares them, and
  they go with the Deployment. Read from the watched copy; written with a merge patch of that
  one annotation (RBAC: ``patch`` on the Deployment by name);
- the replicas' documents (each one's cloud spend today) as keys of one ConfigMap in warmgate's
  own namespace, ``warmgate-state``, created on the first write (RBAC: ``create``, and ``get``,
  ``patch`` on that name).

A document is decoded by :mod:`backends.documents` (bounded, one JSON object): one that cannot
be read is ignored with a warning; one that cannot be written is a
:class:`BackendError` (the writer logs it and tries again with the next change).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from backends.base import BackendError
from backends.documents import decode_all, decode_kept, encode
from backends.kubernetes.api import (
    CONFIGMAPS,
    DEPLOYMENTS,
    Conflict,
    Json,
    KubeApi,
    KubeError,
    NotFound,
)

log = logging.getLogger("warmgate.state")

ANNOTATION = "warmgate.io/"
"""Prefix of the annotations a target's documents are kept in."""
CONFIGMAP = "warmgate-state"
"""The ConfigMap (in warmgate's namespace) the replicas keep their documents in."""


def _not_connected(where: str) -> BackendError:
    return BackendError(f"{where}: not connected to the API server")


class DeploymentAnnotations:
    """A target's documents on its Deployment. ``api`` and ``deployment`` are read at each
    call: the backend's connection and its watched copy of the Deployment."""

    def __init__(
        self,
        namespace: str,
        name: str,
        api: Callable[[], KubeApi | None],
        deployment: Callable[[], Json | None],
    ) -> None:
        self.namespace, self.name = namespace, name
        self._api, self._deployment = api, deployment

    @property
    def where(self) -> str:
        return f"deployment {self.namespace}/{self.name}"

    def name_of(self, key: str) -> str:
        return f"{self.where} ({ANNOTATION}{key})"

    def _kept(self) -> dict[str, Any]:
        """The annotations that are documents, by key (the prefix taken off)."""
        deployment = self._deployment() or {}
        annotations = (deployment.get("metadata") or {}).get("annotations") or {}
        n = len(ANNOTATION)
        return {name[n:]: raw for name, raw in annotations.items() if name.startswith(ANNOTATION)}

    async def load(self, key: str) -> dict[str, Any] | None:
        return decode_kept(self._kept().get(key), self.name_of(key))

    async def load_all(self, prefix: str) -> dict[str, dict[str, Any]]:
        return decode_all(self._kept(), prefix, self.name_of)

    async def save(self, key: str, document: Mapping[str, Any]) -> None:
        api = self._api()
        if api is None:
            raise _not_connected(self.where)
        patch = {"metadata": {"annotations": {ANNOTATION + key: encode(document)}}}
        try:
            await api.patch(DEPLOYMENTS, self.namespace, self.name, patch)
        except KubeError as exc:
            raise BackendError(f"{self.where}: {exc.message}") from exc


class ConfigMapStore:
    """Documents as the keys of one ConfigMap; each writer patches its own key only, so the
    replicas never overwrite each other's."""

    def __init__(self, namespace: str, api: Callable[[], KubeApi | None], name: str = CONFIGMAP):
        self.namespace, self.name = namespace, name
        self._api = api

    @property
    def where(self) -> str:
        return f"configmap {self.namespace}/{self.name}"

    def name_of(self, key: str) -> str:
        return f"{self.where} ({key})"

    async def _data(self) -> dict[str, Any]:
        api = self._api()
        if api is None:
            log.warning("cannot read %s: not connected to the API server", self.where)
            return {}
        try:
            configmap = await api.get(CONFIGMAPS, self.namespace, self.name)
        except NotFound:
            return {}
        except KubeError as exc:
            log.warning("cannot read %s: %s", self.where, exc.message)
            return {}
        return dict(configmap.get("data") or {})

    async def load(self, key: str) -> dict[str, Any] | None:
        return decode_kept((await self._data()).get(key), self.name_of(key))

    async def load_all(self, prefix: str) -> dict[str, dict[str, Any]]:
        return decode_all(await self._data(), prefix, self.name_of)

    async def save(self, key: str, document: Mapping[str, Any]) -> None:
        api = self._api()
        if api is None:
            raise _not_connected(self.where)
        data = {key: encode(document)}
        try:
            try:
                await api.patch(CONFIGMAPS, self.namespace, self.name, {"data": data})
            except NotFound:
                body = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": self.name,
                        "labels": {"app.kubernetes.io/managed-by": "warmgate"},
                    },
                    "data": data,
                }
                try:
                    await api.create(CONFIGMAPS, self.namespace, body)
                except Conflict:  # another replica made it meanwhile
                    await api.patch(CONFIGMAPS, self.namespace, self.name, {"data": data})
        except KubeError as exc:
            raise BackendError(f"{self.where}: {exc.message}") from exc
