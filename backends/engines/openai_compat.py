"""``engine: openai``: a local OpenAI-compatible model server (vLLM, llama.cpp server, TGI).

- **Ready**: ``GET /v1/models`` answers 200 (vLLM listens only once its weights are loaded); never
  a completion, which would cost GPU time at every probe.
- **Busy**: requests in flight, which the router counts itself; a streamed completion
  (``text/event-stream``) is in flight for its whole life, however slowly tokens come.
- **Wakes**: requests that ask for work (``POST /v1/chat/completions``, ``/v1/embeddings``, ...)
  and page loads; not reads such as ``GET /v1/models`` or ``/health``, which clients and
  dashboards poll.
- **Parks** (``park: auto`` with ``engine_options.sleep_mode: true``): vLLM's sleep mode as vLLM
  documents it (the server started with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``):
  ``POST /sleep?level=1`` (the weights go to host memory, the KV cache is dropped),
  ``POST /wake_up``, and ``GET /is_sleeping`` -> ``{"is_sleeping": bool}``.
"""

from __future__ import annotations

from backends.base import RequestFacts, StreamActivity
from backends.engines.common import SAFE_METHODS, EngineBase
from backends.specs import EngineCall, ParkedCheck, ParkRequests

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

    def request_wakes(self, facts: RequestFacts) -> bool:
        return facts.method not in SAFE_METHODS

    def stream_activity(self, path: str) -> StreamActivity:
        return "open"
