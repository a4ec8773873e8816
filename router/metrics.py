"""Prometheus metrics, one registry per app (tests run several apps in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_COLD_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 90, 120, 180, 300, 600)
_WAKE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        ns = "warmgate"
        self.requests = Counter(
            "requests", "Requests answered", ["target", "method", "code"], namespace=ns, registry=r
        )
        self.request_duration = Histogram(
            "request_duration_seconds",
            "Time from request to the end of the response, holds included",
            ["target"],
            buckets=_LATENCY_BUCKETS,
            namespace=ns,
            registry=r,
        )
        self.in_flight = Gauge(
            "in_flight", "Requests being forwarded", ["target"], namespace=ns, registry=r
        )
        self.upstream_errors = Counter(
            "upstream_errors",
            "Exchanges with an upstream that failed",
            ["target", "kind"],
            namespace=ns,
            registry=r,
        )
        self.websockets_open = Gauge(
            "websockets_open", "Proxied websockets open", ["target"], namespace=ns, registry=r
        )
        self.websockets_held = Gauge(
            "websockets_held",
            "Websockets held open for a target that is not ready (waiting.hold_websockets)",
            ["target"],
            namespace=ns,
            registry=r,
        )
        self.bytes = Counter(
            "bytes",
            "Body bytes proxied (in: from clients, out: to clients)",
            ["target", "direction"],
            namespace=ns,
            registry=r,
        )
        self.target_phase = Gauge(
            "target_phase",
            "1 for the phase a target is in, 0 for the others",
            ["target", "phase"],
            namespace=ns,
            registry=r,
        )
        self.cold_starts = Counter(
            "cold_starts", "Cold starts begun", ["target"], namespace=ns, registry=r
        )
        self.lifecycle_errors = Counter(
            "lifecycle_errors",
            "Failures of a step of a target's lifecycle loop (it goes on after a backoff)",
            ["target", "step"],
            namespace=ns,
            registry=r,
        )
        self.cold_start_seconds = Histogram(
            "cold_start_seconds",
            "From scale-up to ready",
            ["target"],
            buckets=_COLD_BUCKETS,
            namespace=ns,
            registry=r,
        )
        self.cold_start_stage_seconds = Histogram(
            "cold_start_stage_seconds",
            "Time a start spent in each stage (scheduling, unschedulable, preempting, pulling, "
            "starting, loading)",
            ["target", "stage"],
            buckets=_COLD_BUCKETS,
            namespace=ns,
            registry=r,
        )
        self.leader = Gauge(
            "leader",
            "1 while this replica holds the leader Lease (decides scale-downs), else 0",
            namespace=ns,
            registry=r,
        )
        self.peers = Gauge(
            "peers",
            "Other warmgate replicas, by whether the last read of their activity was answered",
            ["state"],
            namespace=ns,
            registry=r,
        )
        self.held_requests = Gauge(
            "held_requests", "Requests held for a cold start", ["target"], namespace=ns, registry=r
        )
        self.hold_seconds = Histogram(
            "hold_seconds",
            "How long requests were held",
            ["target"],
            buckets=_COLD_BUCKETS,
            namespace=ns,
            registry=r,
        )
        self.hold_outcomes = Counter(
            "hold_outcomes",
            "How holds ended: ready, timeout, failed, shed, disconnected",
            ["target", "outcome"],
            namespace=ns,
            registry=r,
        )
        self.idle_releases = Counter(
            "idle_releases", "Scale-downs after idle_after", ["target"], namespace=ns, registry=r
        )
        self.gpu_seconds = Counter(
            "gpu_seconds",
            "Seconds a target spent ready, with activity (busy) or without (idle)",
            ["target", "state"],
            namespace=ns,
            registry=r,
        )
        self.parks = Counter(
            "parks",
            "Parks made: the engine dropped its weights from the GPU, its process stays",
            ["target"],
            namespace=ns,
            registry=r,
        )
        self.wake_seconds = Histogram(
            "wake_seconds",
            "From parked to ready: the engine's reload (and warm-up)",
            ["target"],
            buckets=_WAKE_BUCKETS,
            namespace=ns,
            registry=r,
        )
        self.pool_resident = Gauge(
            "pool_resident",
            "Targets of a GPU pool holding its GPUs now (starting, ready, draining, parking, "
            "waking)",
            ["pool"],
            namespace=ns,
            registry=r,
        )
        self.pool_displacements = Counter(
            "pool_displacements",
            "Resident targets a GPU pool displaced for another, parked or stopped",
            ["pool", "target", "how"],
            namespace=ns,
            registry=r,
        )
        self.rollout_failures = Counter(
            "rollout_failures",
            "Rollouts of a target that did not converge within scaling.rollout_timeout",
            ["target"],
            namespace=ns,
            registry=r,
        )
        self.outside_refused = Counter(
            "outside_refused",
            "Numbers from outside refused as no answer (out of bounds, not finite, a bool), "
            "by source (engine, peer, state) and field",
            ["source", "field"],
            namespace=ns,
            registry=r,
        )
        self.pool_waits = Counter(
            "pool_waits",
            "Starts or wakes that had to wait for room in their GPU pool",
            ["pool", "target"],
            namespace=ns,
            registry=r,
        )
