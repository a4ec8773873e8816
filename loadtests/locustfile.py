"""Locust scenarios that behave like warmgate's real clients.

- ``RenderUIUser``: a browser on the render URL: the page (following warmgate's waiting page
  through a cold start, as the page's own script does), a burst of asset requests, ComfyUI's
  websocket, ``POST /prompt``, progress until done, ``GET /view`` of the result.
- ``OpenAIUser``: streamed chat completions (time to first token and total) and image
  generations through warmgate's OpenAI-compatible API.
- ``IdleThenBurst`` (opt in with ``WARMGATE_SHAPE=idle-then-burst``): no traffic until the targets
  are released to zero, then 100 users within 10 seconds (the cold start under load), then steady.

Custom events show in locust's stats: ``COLD`` rows for the seconds requests waited for a cold
start (``X-Warmgate-Cold-Start``, and the waiting page), ``DECISION`` rows counting
``X-Warmgate-Decision`` values.

Against a real deployment::

    locust -f loadtests/locustfile.py --host https://render.lab.example \\
        --headless -u 50 -r 5 -t 10m RenderUIUser OpenAIUser

Environment: ``WARMGATE_ADMIN`` (admin URL, lets the shape wait for the release),
``WARMGATE_CHAT_MODEL`` (default qwen3-8b), ``WARMGATE_IMAGE_MODEL`` (flux-dev),
``WARMGATE_API_KEY``, ``WARMGATE_RENDER_SECONDS_MAX`` (60), ``WARMGATE_COUNTS_FILE`` (where the
sent/answered counts are written at the end).
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from typing import Any

import gevent
import requests
import websocket
from locust import HttpUser, LoadTestShape, between, events, task

CHAT_MODEL = os.environ.get("WARMGATE_CHAT_MODEL", "qwen3-8b")
IMAGE_MODEL = os.environ.get("WARMGATE_IMAGE_MODEL", "flux-dev")
API_KEY = os.environ.get("WARMGATE_API_KEY", "")
ADMIN = os.environ.get("WARMGATE_ADMIN", "")
RENDER_MAX = float(os.environ.get("WARMGATE_RENDER_SECONDS_MAX", "60"))
COUNTS_FILE = os.environ.get("WARMGATE_COUNTS_FILE", "")
PAGE_HEADERS = {"Accept": "text/html,application/xhtml+xml", "Sec-Fetch-Mode": "navigate"}
ASSETS = ("static/app.css", "static/app.js")

counts = {"sent": 0, "answered": 0}


def _record_headers(response: requests.Response) -> None:
    waited = response.headers.get("X-Warmgate-Cold-Start")
    if waited is not None:
        events.request.fire(
            request_type="COLD",
            name="held through a cold start",
            response_time=float(waited) * 1000,
            response_length=0,
            exception=None,
            context={},
        )
    decision = response.headers.get("X-Warmgate-Decision")
    if decision is not None:
        events.request.fire(
            request_type="DECISION",
            name=decision.partition("; queue_depth=")[0],  # one row per reason, any depth
            response_time=0,
            response_length=0,
            exception=None,
            context={},
        )


class _Counted:
    """Counts a request as sent on entry and answered when a response arrived."""

    def __enter__(self) -> _Counted:
        counts["sent"] += 1
        return self

    def answered(self) -> None:
        counts["answered"] += 1

    def __exit__(self, *exc: object) -> None:
        return None


class RenderUIUser(HttpUser):
    wait_time = between(1, 3)

    def on_start(self) -> None:
        self.client_id = uuid.uuid4().hex
        self.open_ui()

    def _get(self, path: str, name: str, **kwargs: Any) -> requests.Response:
        with _Counted() as c:
            response = self.client.get(path, name=name, **kwargs)
            c.answered()
        _record_headers(response)
        return response

    def open_ui(self) -> None:
        with (
            _Counted() as c,
            self.client.get("/", headers=PAGE_HEADERS, name="page", catch_response=True) as resp,
        ):
            c.answered()
            if resp.status_code == 503 and "/.warmgate/status/" in resp.text:
                resp.success()  # the waiting page is the right answer for a cold target
                waiting = resp.text
            elif resp.status_code == 200:
                resp.success()
                waiting = ""
            else:
                resp.failure(f"page: {resp.status_code}")
                return
        if waiting:
            self._follow_waiting_page(waiting)
            self._get("/", "page", headers=PAGE_HEADERS)
        jobs = [gevent.spawn(self._get, "/" + ASSETS[i % len(ASSETS)], "asset") for i in range(12)]
        gevent.joinall(jobs)

    def _follow_waiting_page(self, page: str) -> None:
        """What the waiting page's script does: poll the phase, then reload."""
        found = re.search(r'"target": "([^"]+)"', page)
        status_url = "/.warmgate/status/" + (found.group(1) if found else "demo")
        started = time.monotonic()
        while time.monotonic() - started < 600:
            resp = self._get(status_url, "/.warmgate/status")
            if resp.ok and resp.json().get("ready"):
                events.request.fire(
                    request_type="COLD",
                    name="waiting page until ready",
                    response_time=(time.monotonic() - started) * 1000,
                    response_length=0,
                    exception=None,
                    context={},
                )
                return
            gevent.sleep(0.5)

    def _ws_url(self) -> str:
        base = self.host.replace("http://", "ws://").replace("https://", "wss://")
        return f"{base.rstrip('/')}/ws?clientId={self.client_id}"

    @task
    def render(self) -> None:
        started = time.monotonic()
        try:
            ws = websocket.create_connection(self._ws_url(), timeout=RENDER_MAX)
        except websocket.WebSocketBadStatusException as exc:
            if exc.status_code == 503:  # released to zero meanwhile: reload like a person
                self.open_ui()
                return
            raise
        try:
            graph = {
                "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a warm gate"}},
                "3": {"class_type": "KSampler", "inputs": {"seed": random.randint(0, 2**31)}},
                "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64}},
            }
            with _Counted() as c:
                resp = self.client.post(
                    "/prompt", json={"prompt": graph, "client_id": self.client_id}, name="/prompt"
                )
                c.answered()
            if resp.status_code != 200:
                return
            image = self._follow(ws, resp.json()["prompt_id"])
        finally:
            ws.close()
        events.request.fire(
            request_type="WS",
            name="render until done",
            response_time=(time.monotonic() - started) * 1000,
            response_length=0,
            exception=None if image else RuntimeError("no image"),
            context={},
        )
        if image:
            self._get("/view", "/view", params={"filename": image, "type": "output"})

    def _follow(self, ws: websocket.WebSocket, prompt_id: str) -> str | None:
        image = None
        deadline = time.monotonic() + RENDER_MAX
        while time.monotonic() < deadline:
            try:
                message = ws.recv()
            except websocket.WebSocketConnectionClosedException:
                return None
            if isinstance(message, bytes):
                continue  # a binary preview frame
            event = json.loads(message)
            data: dict[str, Any] = event.get("data", {})
            if data.get("prompt_id") != prompt_id:
                continue
            if event["type"] == "executed":
                images = data.get("output", {}).get("images", [])
                image = images[0]["filename"] if images else None
            elif event["type"] == "execution_success":
                return image
        return None


class OpenAIUser(HttpUser):
    wait_time = between(1, 3)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"} if API_KEY else {}

    @task(3)
    def chat_stream(self) -> None:
        body = {
            "model": CHAT_MODEL,
            "stream": True,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Say something warm."}],
        }
        started = time.monotonic()
        first = None
        done = False
        with (
            _Counted() as c,
            self.client.post(
                "/v1/chat/completions",
                json=body,
                headers=self._headers(),
                stream=True,
                name="chat (stream, total)",
                catch_response=True,
            ) as resp,
        ):
            c.answered()
            _record_headers(resp)
            if resp.status_code != 200:
                resp.failure(f"{resp.status_code}: {resp.text[:200]}")
                return
            for line in resp.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                if first is None:
                    first = time.monotonic()
                if line == b"data: [DONE]":
                    done = True
            if not done:
                resp.failure("stream ended without data: [DONE]")
        if first is not None:
            events.request.fire(
                request_type="POST",
                name="chat (stream, time to first token)",
                response_time=(first - started) * 1000,
                response_length=0,
                exception=None,
                context={},
            )

    @task(1)
    def image(self) -> None:
        body = {"model": IMAGE_MODEL, "prompt": "a lighthouse", "size": "64x64", "n": 1}
        with (
            _Counted() as c,
            self.client.post(
                "/v1/images/generations",
                json=body,
                headers=self._headers(),
                name="images",
                catch_response=True,
            ) as resp,
        ):
            c.answered()
            _record_headers(resp)
            if resp.status_code != 200 or not resp.json()["data"][0].get("b64_json"):
                resp.failure(f"{resp.status_code}: {resp.text[:200]}")


def _all_cold() -> bool:
    try:
        targets = requests.get(ADMIN.rstrip("/") + "/targets", timeout=2).json()
    except (requests.RequestException, ValueError):
        return False
    return all(t["phase"] == "cold" for t in targets.values())


class IdleThenBurst(LoadTestShape):
    """No traffic until every target is released to zero (or ``WARMGATE_IDLE_SECONDS``), then
    100 users within 10 s, then ``WARMGATE_STEADY_USERS`` (20) until the run's time limit."""

    use_common_options = True
    abstract = os.environ.get("WARMGATE_SHAPE") != "idle-then-burst"
    burst_users = int(os.environ.get("WARMGATE_BURST_USERS", "100"))
    steady_users = int(os.environ.get("WARMGATE_STEADY_USERS", "20"))
    burst_seconds = 10.0
    hold_seconds = float(os.environ.get("WARMGATE_BURST_HOLD_SECONDS", "30"))
    idle_seconds = float(os.environ.get("WARMGATE_IDLE_SECONDS", "0"))
    traffic_seconds = float(os.environ.get("WARMGATE_TRAFFIC_SECONDS", "0"))
    """Seconds of traffic after the burst began; 0: until locust's own --run-time."""

    def __init__(self) -> None:
        super().__init__()
        self.burst_at: float | None = None

    def tick(self) -> tuple[int, float] | None:
        run_time = self.get_run_time()
        if self.burst_at is None:
            idle_done = run_time >= self.idle_seconds and (not ADMIN or _all_cold())
            if not idle_done:
                return (0, 1)
            self.burst_at = run_time
        since = run_time - self.burst_at
        if self.traffic_seconds and since >= self.traffic_seconds:
            return None
        if since < self.burst_seconds + self.hold_seconds:
            return (self.burst_users, self.burst_users / self.burst_seconds)
        return (self.steady_users, self.steady_users)


@events.quitting.add_listener
def _write_counts(environment: Any, **kwargs: Any) -> None:
    if COUNTS_FILE:
        with open(COUNTS_FILE, "w") as out:
            json.dump(counts, out)
