"""Typed keys for state shared through aiohttp applications."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

from router.cluster.replicas import Replicas
from router.config import Config
from router.metrics import Metrics
from router.scale.targets import TargetRuntime


@dataclass
class Readiness:
    """What /readyz reports: config loaded (always, once running), listeners bound, backends."""

    listening: bool = False
    runtimes: Mapping[str, TargetRuntime] = field(default_factory=dict)
    replicas: Replicas | None = None

    def problems(self) -> list[str]:
        out = [] if self.listening else ["listeners not bound yet"]
        if self.replicas is not None:
            out.extend(f"replicas: {p}" for p in self.replicas.membership.problems())
        for name, runtime in self.runtimes.items():
            degraded = runtime.backend.observe().degraded
            if degraded:
                out.append(f"{name}: {degraded}")
        return out


CONFIG = web.AppKey("config", Config)
METRICS = web.AppKey("metrics", Metrics)
RUNTIMES = web.AppKey("runtimes", Mapping[str, TargetRuntime])
READINESS = web.AppKey("readiness", Readiness)
