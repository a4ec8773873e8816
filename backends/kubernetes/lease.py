"""The replicas' leader Lease (``coordination.k8s.io/v1``), taken and renewed the way client-go's
leader election does it.

A Lease whose holder has not renewed for ``leaseDurationSeconds`` (measured on this replica's own
clock, from when it last saw the record change, so clocks of different nodes never need to
agree) may be taken with a conditional update; of two replicas that try at once, one gets a 409
Conflict. A leader counts itself leading only until a margin before its Lease could expire, so
two replicas never both believe they lead.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
from collections.abc import Callable
from typing import Any

from backends.kubernetes.api import LEASES, Conflict, Json, KubeApi, NotFound
from backends.specs import ReplicasSpec

log = logging.getLogger("warmgate.replicas")


def _micro_time(at: dt.datetime) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds, UTC."""
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElection:
    """One replica's side of the election: one try at a time (the caller serializes them and
    retries); :class:`~backends.kubernetes.api.KubeError` is the caller's to handle."""

    def __init__(
        self, spec: ReplicasSpec, identity: str, wall_clock: Callable[[], dt.datetime]
    ) -> None:
        self.spec = spec
        self.identity = identity
        self._wall = wall_clock
        self._valid_until = float("-inf")
        """Loop time until which this replica may count itself the leader."""
        self._seen: tuple[Any, Any] | None = None
        """(holder, renewTime) of the Lease as last read; a change restarts its expiry."""
        self._seen_at = 0.0
        self.holder: str | None = None
        """Who holds the Lease, as last read."""

    def leading(self) -> bool:
        return asyncio.get_running_loop().time() < self._valid_until

    def _record(self, lease: Json) -> None:
        """Remember the Lease as read; its expiry runs from when its record last changed."""
        spec = lease.get("spec") or {}
        seen = (spec.get("holderIdentity"), spec.get("renewTime"))
        if seen != self._seen:
            self._seen, self._seen_at = seen, asyncio.get_running_loop().time()
        self.holder = spec.get("holderIdentity") or None

    def _lease_body(self, old: Json | None) -> Json:
        now = _micro_time(self._wall())
        spec = (old or {}).get("spec") or {}
        held = spec.get("holderIdentity") == self.identity
        transitions = int(spec.get("leaseTransitions") or 0)
        metadata = dict((old or {}).get("metadata") or {"name": self.spec.lease})
        return {
            "apiVersion": LEASES.api_version,
            "kind": "Lease",
            "metadata": metadata,  # with its resourceVersion: the update is conditional
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, math.ceil(self.spec.lease_duration)),
                "acquireTime": spec.get("acquireTime") if held else now,
                "renewTime": now,
                "leaseTransitions": transitions if held or old is None else transitions + 1,
            },
        }

    async def try_acquire_or_renew(self, api: KubeApi) -> None:
        """Renew the Lease while holding it; take it when it is free or expired."""
        spec = self.spec
        loop = asyncio.get_running_loop()
        try:
            lease = await api.get(LEASES, spec.namespace, spec.lease)
        except NotFound:
            sent_at = loop.time()
            try:
                stored = await api.create(LEASES, spec.namespace, self._lease_body(None))
            except Conflict:  # another replica created it first: look again next round
                return
            self._won(stored, sent_at)
            return
        self._record(lease)
        lease_spec = lease.get("spec") or {}
        holder = lease_spec.get("holderIdentity")
        duration = float(lease_spec.get("leaseDurationSeconds") or spec.lease_duration)
        if holder and holder != self.identity and loop.time() < self._seen_at + duration:
            self._valid_until = float("-inf")  # held by another, not expired
            return
        sent_at = loop.time()
        try:
            stored = await api.replace(LEASES, spec.namespace, self._lease_body(lease))
        except Conflict:  # someone else renewed or took it in between
            self._valid_until = float("-inf")
            return
        if holder and holder != self.identity:
            log.info("replica %s takes the Lease from %s (expired)", self.identity, holder)
        self._won(stored, sent_at)

    def _won(self, stored: Json, sent_at: float) -> None:
        self._record(stored)
        # Another replica can take the Lease no sooner than lease_duration after it saw this
        # renewal, which is after it was sent; half a renewal interval is kept as margin.
        self._valid_until = sent_at + self.spec.lease_duration - self.spec.renew_interval / 2

    async def release(self, api: KubeApi) -> None:
        """Hand over at once (client-go's ReleaseOnCancel): no holder, a 1 s duration."""
        spec = self.spec
        lease = await api.get(LEASES, spec.namespace, spec.lease)
        if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        body = self._lease_body(lease)
        body["spec"] = {**body["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
        with contextlib.suppress(Conflict):
            await api.replace(LEASES, spec.namespace, body)
            log.info("replica %s released the leadership", self.identity)
        self._valid_until = float("-inf")
