"""``engine: openai``: a local OpenAI-compatible model server (vLLM, llama.cpp server, TGI).

- **Ready**: ``GET /v1/models`` answers 200 (vLLM listens only once its weights are loaded); never
  a completion, which would cost GPU time at every probe.
- **Busy**: requests in flight, which the router counts itself; a streamed completion
  (``text/event-stream``) is in flight for its whole life, however slowly tokens come.
- **Wakes**: requests that ask for work (``POST /v1/chat/completions``, ``/v1/embeddings``, ...)
  and page loads; not reads such as ``GET /v1/models`` or ``/health``, which clients and
  dashboards poll.
"""

from __future__ import annotations

from backends.base import RequestFacts, StreamActivity
from backends.engines.common import SAFE_METHODS, EngineBase


class OpenAIEngine(EngineBase):
    default_ready_path = "/v1/models"

    def request_wakes(self, facts: RequestFacts) -> bool:
        return facts.method not in SAFE_METHODS

    def stream_activity(self, path: str) -> StreamActivity:
        return "open"
