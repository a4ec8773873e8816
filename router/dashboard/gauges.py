"""Gauges the operator's view adds to ``/metrics``: what the alert rules compare against
(deploy/monitoring/). Read when scraped, from the state the rest of warmgate already keeps."""

from __future__ import annotations

from collections.abc import Mapping

from router.metrics import Families, Metrics
from router.openai.budget import Budget
from router.scale.targets import TargetRuntime


def add_gauges(
    metrics: Metrics, runtimes: Mapping[str, TargetRuntime], budget: Budget | None
) -> None:
    make = Families(metrics.registry)
    eta = make.gauge(
        "cold_start_eta_seconds",
        "Expected seconds from scale-up to ready, as the waiting page shows it (learned from "
        "the recent cold starts, kept across restarts; scaling.expected_cold_start before the "
        "first)",
        ["target"],
    )
    for name, runtime in runtimes.items():
        eta.labels(name).set_function(runtime.learned.predicted_cold_start)
    if budget is not None:  # the OpenAI-compatible API is served
        limit = make.gauge(
            "cloud_budget_usd",
            "USD the day's cloud budget allows (policy.daily_cloud_budget_usd), all replicas "
            "together",
        )
        limit.set_function(lambda: budget.limit)
