"""Prometheus metrics, one registry per app (tests run several apps in one process).

:class:`Metrics` holds warmgate's own, defined by room (the traffic, the holds, the lifecycle,
the GPUs, the replicas); the API (:class:`router.openai.api.ApiMetrics`) and the dashboard's
gauges (:mod:`router.dashboard.gauges`) add theirs to the same registry through
:class:`Families`."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "warmgate"
"""Every family is ``warmgate_<name>``."""

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_COLD_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 90, 120, 180, 300, 600)
_WAKE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30, 60, 120)


class Families:
    """Makes the metric families of one registry, in warmgate's namespace."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, labels, namespace=NAMESPACE, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, labels, namespace=NAMESPACE, registry=self.registry)

    def histogram(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(
            name, doc, labels, buckets=buckets, namespace=NAMESPACE, registry=self.registry
        )


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        make = Families(self.registry)
        self._traffic(make)
        self._holds(make)
        self._lifecycle(make)
        self._gpus(make)
        self._replicas(make)
        self.outside_refused = make.counter(
            "outside_refused",
            "Numbers from outside refused as no answer (out of bounds, not finite, a bool), "
            "by source (engine, peer, state) and field",
            ["source", "field"],
        )

    def _traffic(self, make: Families) -> None:
        """Requests, websockets and bytes forwarded (router.http)."""
        self.requests = make.counter("requests", "Requests answered", ["target", "method", "code"])
        self.request_duration = make.histogram(
            "request_duration_seconds",
            "Time from request to the end of the response, holds included",
            ["target"],
            _LATENCY_BUCKETS,
        )
        self.in_flight = make.gauge("in_flight", "Requests being forwarded", ["target"])
        self.upstream_errors = make.counter(
            "upstream_errors", "Exchanges with an upstream that failed", ["target", "kind"]
        )
        self.websockets_open = make.gauge("websockets_open", "Proxied websockets open", ["target"])
        self.websockets_held = make.gauge(
            "websockets_held",
            "Websockets held open for a target that is not ready (waiting.hold_websockets)",
            ["target"],
        )
        self.bytes = make.counter(
            "bytes",
            "Body bytes proxied (in: from clients, out: to clients)",
            ["target", "direction"],
        )

    def _holds(self, make: Families) -> None:
        """Requests waiting for a cold start (router.scale.hold)."""
        self.held_requests = make.gauge(
            "held_requests", "Requests held for a cold start", ["target"]
        )
        self.hold_seconds = make.histogram(
            "hold_seconds", "How long requests were held", ["target"], _COLD_BUCKETS
        )
        self.hold_outcomes = make.counter(
            "hold_outcomes",
            "How holds ended: ready, timeout, failed, shed, disconnected",
            ["target", "outcome"],
        )

    def _lifecycle(self, make: Families) -> None:
        """A target's phases, its starts and its releases (router.scale)."""
        self.target_phase = make.gauge(
            "target_phase", "1 for the phase a target is in, 0 for the others", ["target", "phase"]
        )
        self.cold_starts = make.counter("cold_starts", "Cold starts begun", ["target"])
        self.lifecycle_errors = make.counter(
            "lifecycle_errors",
            "Failures of a step of a target's lifecycle loop (it goes on after a backoff)",
            ["target", "step"],
        )
        self.cold_start_seconds = make.histogram(
            "cold_start_seconds", "From scale-up to ready", ["target"], _COLD_BUCKETS
        )
        self.cold_start_stage_seconds = make.histogram(
            "cold_start_stage_seconds",
            "Time a start spent in each stage (scheduling, unschedulable, preempting, pulling, "
            "starting, loading)",
            ["target", "stage"],
            _COLD_BUCKETS,
        )
        self.idle_releases = make.counter(
            "idle_releases", "Scale-downs after idle_after", ["target"]
        )
        self.rollout_failures = make.counter(
            "rollout_failures",
            "Rollouts of a target that did not converge within scaling.rollout_timeout",
            ["target"],
        )

    def _gpus(self, make: Families) -> None:
        """GPU time, the parked tier and the GPU pools (router.scale's pools and parking)."""
        self.gpu_seconds = make.counter(
            "gpu_seconds",
            "Seconds a target spent ready, with activity (busy) or without (idle)",
            ["target", "state"],
        )
        self.parks = make.counter(
            "parks",
            "Parks made: the engine dropped its weights from the GPU, its process stays",
            ["target"],
        )
        self.wake_seconds = make.histogram(
            "wake_seconds",
            "From parked to ready: the engine's reload (and warm-up)",
            ["target"],
            _WAKE_BUCKETS,
        )
        self.pool_resident = make.gauge(
            "pool_resident",
            "Targets of a GPU pool holding its GPUs now (starting, ready, draining, parking, "
            "waking)",
            ["pool"],
        )
        self.pool_displacements = make.counter(
            "pool_displacements",
            "Resident targets a GPU pool displaced for another, parked or stopped",
            ["pool", "target", "how"],
        )
        self.pool_waits = make.counter(
            "pool_waits",
            "Starts or wakes that had to wait for room in their GPU pool",
            ["pool", "target"],
        )

    def _replicas(self, make: Families) -> None:
        """Several warmgate replicas (router.cluster)."""
        self.leader = make.gauge(
            "leader", "1 while this replica holds the leader Lease (decides scale-downs), else 0"
        )
        self.peers = make.gauge(
            "peers",
            "Other warmgate replicas, by whether the last read of their activity was answered",
            ["state"],
        )
