"""A fake vLLM with sleep mode: :class:`tests.fake_openai.FakeOpenAI` plus the endpoints vLLM
serves when started with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``, on the same
wire format:

- ``POST /sleep?level=1`` (level 1 offloads the weights to host memory, 2 discards them): 200,
  empty body;
- ``POST /wake_up`` (optionally ``?tags=weights``): 200, empty body;
- ``GET /is_sleeping``: ``{"is_sleeping": bool}``.

While asleep it refuses completions with a 503 (a router that forwards to a sleeping engine is
caught). ``GET /_fake/sleep`` tells the calls it received, in order.

Its scheduler is vLLM's in miniature: at most ``max_num_seqs`` completions run at once (vLLM's
``--max-num-seqs``), each for ``seconds_per_request`` of "GPU time" before it answers; the rest
wait. ``GET /metrics`` tells both as vLLM does (``vllm:num_requests_running``,
``vllm:num_requests_waiting``, per ``model_name``). As a process:
``python -m tests.fake_vllm --port P [--startup-delay S] [--max-num-seqs N]
[--seconds-per-request S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field

from aiohttp import web

from tests.fake_openai import FakeOpenAI


@dataclass
class FakeVllm(FakeOpenAI):
    sleeping: int = 0
    """The sleep level, 0 while awake."""
    calls: list[str] = field(default_factory=list)
    """``sleep?level=1``, ``wake_up``, ``is_sleeping``, and ``refused`` for a completion that
    arrived while asleep."""
    max_num_seqs: int = 256
    """Completions run at once; the others wait (vLLM's default is 256)."""
    seconds_per_request: float = 0.0
    """Seconds each completion runs before it answers."""
    running: int = 0
    waiting: int = 0
    _seqs: asyncio.Semaphore | None = None

    async def sleep(self, request: web.Request) -> web.Response:
        level = request.query.get("level", "1")
        self.calls.append(f"sleep?level={level}")
        if level not in ("1", "2"):
            return web.json_response({"error": f"invalid level {level}"}, status=400)
        self.sleeping = int(level)
        return web.Response(status=200)

    async def wake_up(self, request: web.Request) -> web.Response:
        self.calls.append("wake_up")
        self.sleeping = 0
        return web.Response(status=200)

    async def is_sleeping(self, request: web.Request) -> web.Response:
        self.calls.append("is_sleeping")
        return web.json_response({"is_sleeping": self.sleeping > 0})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if self.sleeping:
            self.calls.append("refused")
            return self.error(503, "the engine is sleeping", "server_error")
        if self._seqs is None:
            self._seqs = asyncio.Semaphore(self.max_num_seqs)
        self.waiting += 1
        scheduled = False
        try:
            async with self._seqs:
                self.waiting -= 1
                scheduled = True
                self.running += 1
                try:
                    await asyncio.sleep(self.seconds_per_request)
                    return await super().chat(request)
                finally:
                    self.running -= 1
        finally:
            if not scheduled:
                self.waiting -= 1

    async def metrics(self, request: web.Request) -> web.Response:
        """vLLM's scheduler gauges, in the Prometheus text format its ``/metrics`` serves."""
        labels = f'{{engine="0",model_name="{self.name}"}}'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{labels} {float(self.running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{labels} {float(self.waiting)}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def sleep_log(self, request: web.Request) -> web.Response:
        return web.json_response({"sleeping": self.sleeping, "calls": self.calls})

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/sleep", self.sleep)
        app.router.add_post("/wake_up", self.wake_up)
        app.router.add_get("/is_sleeping", self.is_sleeping)
        app.router.add_get("/_fake/sleep", self.sleep_log)
        app.router.add_get("/metrics", self.metrics)
        return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--startup-delay", type=float, default=0.0)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--seconds-per-request", type=float, default=0.0)
    args = parser.parse_args()
    time.sleep(args.startup_delay)
    fake = FakeVllm(
        name="local",
        max_num_seqs=args.max_num_seqs,
        seconds_per_request=args.seconds_per_request,
    )
    web.run_app(fake.app(), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
