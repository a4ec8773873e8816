"""A local OpenAI-compatible model server shaped like vLLM / llama.cpp's server, for the engine
tests: it listens at once but answers 503 until its "weights" are loaded, counts what it was
asked, and streams chat completions with a configurable gap between tokens.

``python -m tests.openai_server --port PORT [--load-seconds S]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

from aiohttp import web

MODEL = "local-qwen"
CALLS = web.AppKey("calls", Counter[str])
LOADED = web.AppKey("loaded", asyncio.Event)


def _loading() -> web.Response:
    return web.json_response({"error": {"message": "Loading model", "code": 503}}, status=503)


async def models(request: web.Request) -> web.Response:
    request.app[CALLS]["models"] += 1
    if not request.app[LOADED].is_set():
        return _loading()
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def stats(request: web.Request) -> web.Response:
    return web.json_response(dict(request.app[CALLS]))


async def chat(request: web.Request) -> web.StreamResponse:
    if not request.app[LOADED].is_set():
        request.app[CALLS]["refused"] += 1
        return _loading()
    request.app[CALLS]["completions"] += 1
    body = await request.json()
    words = ["warm", "gate", "says", "hello"]
    base = {"id": "chatcmpl-1", "created": int(time.time()), "model": body["model"]}
    if not body.get("stream"):
        message = {"role": "assistant", "content": " ".join(words)}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        return web.json_response(
            {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
        )
    gap = float(body.get("token_gap", 0.0))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i, word in enumerate(words):
        if i:
            await asyncio.sleep(gap)
        delta = {"index": 0, "delta": {"content": word + " "}, "finish_reason": None}
        chunk = {**base, "object": "chat.completion.chunk", "choices": [delta]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def build(load_seconds: float) -> web.Application:
    app = web.Application()
    app[CALLS] = Counter()
    app[LOADED] = asyncio.Event()

    async def load(app: web.Application):  # type: ignore[no-untyped-def]
        async def weights() -> None:
            await asyncio.sleep(load_seconds)
            app[LOADED].set()

        task = asyncio.get_running_loop().create_task(weights())
        yield
        task.cancel()

    app.cleanup_ctx.append(load)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/stats", stats)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--load-seconds", type=float, default=0.5)
    args = parser.parse_args()
    web.run_app(build(args.load_seconds), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
