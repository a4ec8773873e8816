"""The pods of one Deployment, watched for the stage of a start (``backends.kubernetes.stages``).

Picked by the Deployment's own selector, listed at start, watched from then on like the
Deployment and its EndpointSlices. A Role without ``pods`` only costs the stages: a warning,
and starts wait without them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from backends.kubernetes.api import PODS, Forbidden, Json, KubeApi
from backends.kubernetes.informer import Backoff, Informer
from backends.kubernetes.stages import label_selector

log = logging.getLogger("warmgate.kubernetes")


class PodWatch:
    def __init__(
        self,
        target: str,
        namespace: str,
        where: str,
        on_change: Callable[[], None],
        *,
        backoff: Backoff,
        watch_timeout: int,
    ) -> None:
        self.target, self.namespace, self.where = target, namespace, where
        self._on_change = on_change
        self._backoff, self._watch_timeout = backoff, watch_timeout
        self.informer: Informer | None = None
        """``None`` until listed, or for good when the Role may not list pods."""
        self._settled = False

    async def list_now(self, api: KubeApi, deployment: Json | None) -> None:
        """Once: the pods the Deployment selects (not there yet: tried at the next call); after
        a 410 Gone: again."""
        if self._settled:
            if self.informer is not None and self.informer.resource_version is None:
                await self.informer.list_now()
            return
        if deployment is None:
            return
        informer = Informer(
            api,
            PODS,
            self.namespace,
            self._on_change,
            label_selector=label_selector((deployment.get("spec") or {}).get("selector")),
            backoff=self._backoff,
            watch_timeout=self._watch_timeout,
        )
        try:
            await informer.list_now()
        except Forbidden as exc:
            log.warning(
                "[%s] cannot watch the pods of %s, so the stage of a start is unknown "
                "(grant pods get, list, watch: deploy/base/router/rbac.yaml): %s",
                self.target,
                self.where,
                exc.message,
            )
        else:
            self.informer = informer
        self._settled = True

    @property
    def problem(self) -> str | None:
        return self.informer.problem if self.informer is not None else None

    def pods(self) -> Iterable[Json] | None:
        """The pods as last seen; ``None`` while they are not watched."""
        return self.informer.objects.values() if self.informer is not None else None
