"""``engine: http``: any HTTP service. Ready when the configured path answers 200; busy only
through traffic (in-flight requests, and streams while they carry frames, which the router
counts itself); any request but a websocket upgrade wakes it (``scaling.wake_on`` narrows that)."""

from __future__ import annotations

from backends.engines.common import EngineBase
from backends.specs import EngineSpec


class HttpEngine(EngineBase):
    def __init__(self, spec: EngineSpec) -> None:
        super().__init__(spec)
        self.ready_path = spec.readiness.path  # the config's, default or not
