"""``engine: openai``: a local OpenAI-compatible model server (vLLM, llama.cpp server, TGI).

- **Ready**: ``GET /v1/models`` answers 200 (vLLM listens only once its weights are loaded); never
  a completion, which would cost GPU time at every probe.
- **Busy**: requests in flight, which the router counts itself; a streamed completion
  (``text/event-stream``) is in flight for its whole life, however slowly tokens come.
- **Queue**: the busy poll reads ``GET /metrics`` (Prometheus text) for the requests the server
  has accepted but not scheduled yet: vLLM's ``vllm:num_requests_waiting`` (TGI's
  ``tgi_queue_size``, llama.cpp's ``llamacpp:requests_deferred``), summed over its label sets.
  That is the queue depth the API policy reads; a server without them tells none.
- **Wakes**: requests that ask for work (``POST /v1/chat/completions``, ``/v1/embeddings``, ...)
  and page loads; not reads such as ``GET /v1/models`` or ``/health``, which clients and
  dashboards poll.
- **Parks** (``park: auto`` with ``engine_options.sleep_mode: true``): vLLM's sleep mode as vLLM
  documents it (the server started with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``):
  ``POST /sleep?level=1`` (the weights go to host memory, the KV cache is dropped),
  ``POST /wake_up``, and ``GET /is_sleeping`` -> ``{"is_sleeping": bool}``.
"""

from __future__ import annotations

from typing import Final

from backends.base import RequestFacts, StreamActivity
from backends.engines.common import PROBE_ERRORS, SAFE_METHODS, EngineBase
from backends.outside import Refused, count, number
from backends.specs import EngineCall, ParkedCheck, ParkRequests

QUEUE_METRICS: Final = (
    "vllm:num_requests_waiting",
    "tgi_queue_size",
    "llamacpp:requests_deferred",
)
"""Gauges of the requests a server accepted and has not scheduled yet; the first one found
counts."""


def waiting_requests(text: str) -> int | None:
    """The requests waiting in a Prometheus text exposition (``/metrics``): the samples of the
    first of :data:`QUEUE_METRICS` it has, summed; ``None`` when it has none."""
    for name in QUEUE_METRICS:
        total, found = 0.0, False
        for line in text.splitlines():
            if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
                continue
            rest = line[line.rfind("}") + 1 :] if "{" in line else line[len(name) :]
            try:
                total += float(rest.split()[0])  # a timestamp may follow the value
            except (ValueError, IndexError):
                continue
            found = True
        if found:
            depth = count(round(total) if number(total) is not None else total)
            if depth is None:  # 1e400 requests waiting, NaN, negative
                raise Refused("requests_waiting")
            return depth
    return None


SLEEP_MODE = ParkRequests(
    request=EngineCall(path="/sleep?level=1"),
    wake=EngineCall(path="/wake_up"),
    parked=ParkedCheck(path="/is_sleeping", json_key="is_sleeping"),
)
"""vLLM's sleep mode, level 1: the weights are kept in host memory, so a wake is a copy back."""


class OpenAIEngine(EngineBase):
    default_ready_path = "/v1/models"

    def auto_park(self) -> ParkRequests | None:
        return SLEEP_MODE if self.spec.options.sleep_mode else None

    async def busy(self, base_url: str) -> bool:
        """Never busy besides the requests in flight; the poll reads the server's queue."""
        self.heard_queue(base_url, await self._waiting(base_url))
        return False

    async def _waiting(self, base_url: str) -> int | None:
        try:
            async with self.client().get(base_url + "/metrics", allow_redirects=False) as reply:
                if reply.status != 200:
                    await reply.read()
                    return None
                return waiting_requests(await reply.text())
        except Refused as refused:
            self.refused(base_url, refused.field, "a number out of bounds")
            return None
        except PROBE_ERRORS:
            return None

    def request_wakes(self, facts: RequestFacts) -> bool:
        return facts.method not in SAFE_METHODS

    def stream_activity(self, path: str) -> StreamActivity:
        return "open"
