"""The narrow interface between the Kubernetes backend and an API server: list, watch, read,
create, replace and merge-patch objects, patch a Deployment's scale, discover served API
versions. Objects travel as plain JSON dicts.

:class:`backends.kubernetes.client.RealKube` implements it over ``kubernetes_asyncio``;
``tests/kube/fake.py`` is its in-memory twin, and one contract suite runs against both. Errors
are this module's own tree; the client translates the library's at its boundary.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from backends.outside import one_line

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Resource:
    """A namespaced resource collection: ``/apis/<group>/<version>/namespaces/<ns>/<plural>``,
    or ``/api/v1/namespaces/<ns>/<plural>`` for the core group (``group`` empty)."""

    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


DEPLOYMENTS = Resource("apps", "v1", "deployments")
HPAS = Resource("autoscaling", "v1", "horizontalpodautoscalers")
SCALED_OBJECTS = Resource("keda.sh", "v1alpha1", "scaledobjects")
LEASES = Resource("coordination.k8s.io", "v1", "leases")
PODS = Resource("", "v1", "pods")
CONFIGMAPS = Resource("", "v1", "configmaps")
ENDPOINTSLICE_GROUP = "discovery.k8s.io"


def endpointslices(served: tuple[str, ...]) -> Resource:
    """EndpointSlices in the version the server serves: ``v1`` from Kubernetes 1.21, ``v1beta1``
    before (the fields read for readiness are the same in both)."""
    for version in ("v1", "v1beta1"):
        if version in served:
            return Resource(ENDPOINTSLICE_GROUP, version, "endpointslices")
    raise NotFound(
        f"the API server serves no EndpointSlices ({ENDPOINTSLICE_GROUP} versions: "
        f"{', '.join(served) or 'none'}); Kubernetes 1.17 or newer is needed",
        status=404,
    )


@dataclass(frozen=True, slots=True)
class ObjectList:
    items: tuple[Json, ...]
    resource_version: str
    """Where a watch resumes to see every change after this list."""


EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    object: Json
    """The object as it is after the change (for DELETED: its last state; for BOOKMARK: only
    ``metadata.resourceVersion``)."""

    @property
    def resource_version(self) -> str:
        return str(self.object.get("metadata", {}).get("resourceVersion", ""))


# -- errors -------------------------------------------------------------------------------------


class KubeError(Exception):
    """An API request that failed; ``message`` is the server's own words where it sent any."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        message = one_line(message)  # the server's words, or a proxy's page in front of it
        super().__init__(message)
        self.message = message
        self.status = status


class Unreachable(KubeError):
    """No answer: connection refused or reset, a timeout, or a 5xx/429 (worth retrying)."""


class Forbidden(KubeError):
    """401/403: warmgate's credentials may not do this (RBAC); retrying does not help."""


class NotFound(KubeError):
    """404: no such object, or the API group is not served (a CRD not installed)."""


class Gone(KubeError):
    """410: the resourceVersion to resume from is too old (compacted, or the API server
    restarted): list again."""


class Conflict(KubeError):
    """409: the object changed since it was read (a stale ``resourceVersion``), or one of that
    name already exists: read it again and decide again."""


class Invalid(KubeError):
    """Any other 4xx: the request itself is wrong."""


def error_for_status(status: int, message: str) -> KubeError:
    """The error for an HTTP status (or a watch ERROR event's ``code``)."""
    if status in (401, 403):
        return Forbidden(message, status=status)
    if status == 404:
        return NotFound(message, status=status)
    if status == 409:
        return Conflict(message, status=status)
    if status == 410:
        return Gone(message, status=status)
    if status >= 500 or status == 429 or status == 0:
        return Unreachable(message, status=status)
    return Invalid(message, status=status)


# -- the interface ------------------------------------------------------------------------------


class KubeApi(Protocol):
    """What the backend needs of an API server. Every method raises :class:`KubeError`."""

    @property
    def server(self) -> str:
        """The API server's URL, for messages."""
        ...

    async def group_versions(self, group: str) -> tuple[str, ...]:
        """Versions of an API group the server serves, preferred first (() if none)."""
        ...

    async def list(
        self,
        resource: Resource,
        namespace: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList: ...

    def watch(
        self,
        resource: Resource,
        namespace: str,
        *,
        resource_version: str,
        timeout_seconds: int,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Entering opens the watch (changes after ``resource_version``, bookmarks allowed);
        the iterator yields events until the server ends the watch after ``timeout_seconds``
        (or the connection breaks: :class:`Unreachable`; a too old version: :class:`Gone`)."""
        ...

    async def get(self, resource: Resource, namespace: str, name: str) -> Json:
        """One object (:class:`NotFound` if there is none)."""
        ...

    async def create(self, resource: Resource, namespace: str, body: Json) -> Json:
        """Create an object; returns it as stored (:class:`Conflict` if the name is taken)."""
        ...

    async def replace(self, resource: Resource, namespace: str, body: Json) -> Json:
        """Replace an object whole; ``body.metadata.resourceVersion`` makes it conditional
        (:class:`Conflict` when the object changed since). Returns it as stored."""
        ...

    async def patch(self, resource: Resource, namespace: str, name: str, body: Json) -> Json:
        """A JSON merge patch (RFC 7386: maps merge, ``None`` removes a key) of one object;
        returns it as stored (:class:`NotFound` if there is none)."""
        ...

    async def get_scale(self, namespace: str, deployment: str) -> int:
        """``spec.replicas`` of the Deployment's Scale; absent (how 0 comes back) means 0."""
        ...

    async def patch_scale(self, namespace: str, deployment: str, replicas: int) -> int:
        """Set the replica count through the scale subresource; returns it as stored."""
        ...

    async def close(self) -> None: ...
