"""A small OpenAI-compatible server that speaks the wire format exactly, for tests and the bench.

It plays a local model server (vLLM-like) or the managed cloud (reached through the ``openai``
SDK). It records every request (path, headers, body) so a test can assert what reached it: the
cloud key never at a local target, private work never at the cloud.

In-process: ``FakeOpenAI().app()`` with :func:`tests.helpers.serve_app`. As a process (a local
target that cold-starts for real): ``python -m tests.fake_openai --port P [--startup-delay S]``;
``GET /_fake/requests`` then tells what it received.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@dataclass
class Recorded:
    path: str
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class FakeOpenAI:
    reply: str = "Hello from the fake server ."
    """Words of every answer; one word per stream chunk, one completion token per word."""
    api_key: str | None = None
    """When set, requests must carry ``Authorization: Bearer <api_key>`` (401 otherwise)."""
    chunk_delay: float = 0.0
    """Seconds between streamed chunks."""
    delay: float = 0.0
    """Seconds before any answer (a slow or hanging cloud)."""
    name: str = "fake"
    requests: list[Recorded] = field(default_factory=list)
    failures: list[tuple[int, str]] = field(default_factory=list)
    """Queued error answers: (status, message); each is used once, first in first out."""

    def fail_next(self, status: int, times: int = 1, message: str = "injected failure") -> None:
        self.failures.extend([(status, message)] * times)

    def count(self, path: str) -> int:
        return sum(1 for r in self.requests if r.path == path)

    # -- wire format ----------------------------------------------------------------------------

    @staticmethod
    def error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        return web.json_response(body, status=status)

    @staticmethod
    def tokens(value: object) -> int:
        """Prompt tokens: one per whitespace-separated word of every string inside."""
        if isinstance(value, str):
            return len(value.split())
        if isinstance(value, list):
            return sum(FakeOpenAI.tokens(v) for v in value)
        if isinstance(value, dict):
            return sum(FakeOpenAI.tokens(v) for v in value.values())
        return 0

    async def _admit(self, request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        raw = await request.read()
        self.requests.append(Recorded(request.path, CIMultiDict(request.headers), raw))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.api_key is not None:
            presented = request.headers.get("Authorization", "")
            if presented != f"Bearer {self.api_key}":
                # quotes what it was given, the way real services' messages partly do
                message = f"Incorrect API key provided: {presented.removeprefix('Bearer ')}"
                return {}, self.error(401, message, "invalid_request_error", "invalid_api_key")
        if self.failures:
            status, message = self.failures.pop(0)
            kind = "server_error" if status >= 500 else "invalid_request_error"
            return {}, self.error(status, message, kind)
        try:
            body = json.loads(raw)
        except ValueError:
            return {}, self.error(400, "We could not parse the JSON body", "invalid_request_error")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return {}, self.error(
                400, "you must provide a model parameter", "invalid_request_error"
            )
        return body, None

    async def models(self, request: web.Request) -> web.Response:
        model = {"id": "fake-model", "object": "model", "created": 0, "owned_by": self.name}
        return web.json_response({"object": "list", "data": [model]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body, failed = await self._admit(request)
        if failed is not None:
            return failed
        words = self.reply.split()
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        if isinstance(limit, int) and limit > 0:
            words = words[:limit]
        prompt = max(1, self.tokens(body.get("messages", [])))
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": len(words),
            "total_tokens": prompt + len(words),
        }
        ident, created, model = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), body["model"]
        if body.get("stream") is not True:
            message = {"role": "assistant", "content": " ".join(words), "refusal": None}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
            return web.json_response(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                    "system_fingerprint": self.name,
                }
            )
        include_usage = (body.get("stream_options") or {}).get("include_usage") is True
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            chunk = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": self.name,
                "choices": choices,
            }
            if include_usage:
                chunk["usage"] = None
            chunk.update(extra)
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        def delta(content: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": content, "logprobs": None, "finish_reason": finish}]

        await send(delta({"role": "assistant", "content": "", "refusal": None}))
        for i, word in enumerate(words):
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            await send(delta({"content": word if i == 0 else " " + word}))
        await send(delta({}, "stop"))
        if include_usage:
            await send([], usage=usage)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def embeddings(self, request: web.Request) -> web.Response:
        body, failed = await self._admit(request)
        if failed is not None:
            return failed
        inputs = body.get("input")
        items = (
            inputs
            if isinstance(inputs, list) and inputs and isinstance(inputs[0], str)
            else [inputs]
        )
        data = []
        for i, item in enumerate(items):
            vector = [float(len(str(item))), float(i), 0.5]
            if body.get("encoding_format") == "base64":
                packed = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
                data.append({"object": "embedding", "index": i, "embedding": packed})
            else:
                data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = max(1, self.tokens(inputs))
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def images(self, request: web.Request) -> web.Response:
        body, failed = await self._admit(request)
        if failed is not None:
            return failed
        n = body.get("n") or 1
        if body.get("response_format") == "url":
            item = {"url": f"https://{self.name}.example/image.png"}
        else:
            item = {"b64_json": base64.b64encode(PNG_1X1).decode()}
        return web.json_response({"created": int(time.time()), "data": [item] * n})

    async def recorded(self, request: web.Request) -> web.Response:
        out = [
            {"path": r.path, "headers": dict(r.headers), "body": r.body.decode(errors="replace")}
            for r in self.requests
        ]
        return web.json_response(out)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_post("/v1/images/generations", self.images)
        app.router.add_get("/_fake/requests", self.recorded)
        return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--startup-delay",
        type=float,
        default=0.0,
        help="seconds before listening (a model loading)",
    )
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument("--reply", default=FakeOpenAI.reply)
    args = parser.parse_args()
    time.sleep(args.startup_delay)
    fake = FakeOpenAI(reply=args.reply, chunk_delay=args.chunk_delay, name="local")
    web.run_app(fake.app(), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
