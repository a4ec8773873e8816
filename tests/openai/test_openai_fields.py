"""The numbers a request's cost is reserved on (``max_tokens``, ``max_completion_tokens``, ``n``)
are checked as OpenAI checks them, for every placement: a value the estimate would not read as
the cloud does is refused with 400, and nothing reaches the cloud. A body nested too deep to
parse is a 400 too, never a 500."""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
import pytest

from tests.helpers import metric_value
from tests.openai_stack import Stack, cloud_key, stack

__all__ = ["cloud_key"]
pytestmark = pytest.mark.usefixtures("cloud_key")

HELLO = [{"role": "user", "content": "hello there"}]

BAD_CHAT: list[tuple[str, Any]] = [
    ("max_tokens", 100000.0),
    ("max_tokens", "100000"),
    ("max_tokens", 0),
    ("max_tokens", -5),
    ("max_tokens", True),
    ("max_completion_tokens", 2.5),
    ("max_completion_tokens", "10"),
    ("n", 50.0),
    ("n", "2"),
    ("n", 0),
    ("n", 129),
]
BAD_IMAGE_N: list[Any] = [0, -1, 11, "2", 2.5, 1e9, True]


async def post(st: Stack, path: str, body: bytes | dict[str, Any]) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else None
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            st.wg.url + path,
            data=data,
            json=None if data is not None else body,
            headers={"Content-Type": "application/json"},
        ) as resp,
    ):
        return resp.status, await resp.json()


def invalid(answer: dict[str, Any], param: str | None) -> bool:
    error = answer["error"]
    return (
        set(error) == {"message", "type", "param", "code"}
        and error["type"] == "invalid_request_error"
        and error["param"] == param
    )


async def test_non_integer_token_limits_and_choices_are_refused_before_the_cloud() -> None:
    async with stack() as st:
        for name, value in BAD_CHAT:
            body = {"model": "frontier", "messages": HELLO, name: value}
            status, answer = await post(st, "/v1/chat/completions", body)
            assert status == 400 and invalid(answer, name), (name, value, answer)
        assert st.cloud.requests == []
        assert st.api.budget.reserved == 0.0 and st.api.budget.spent == 0.0
        good = {"model": "frontier", "messages": HELLO, "max_tokens": 16, "n": 2}
        status, _ = await post(st, "/v1/chat/completions", good)
        assert status == 200  # the control: integers in range pass


async def test_image_n_is_checked_on_cloud_placements() -> None:
    async with stack() as st:
        for n in BAD_IMAGE_N:
            body = {"model": "image-cloud", "prompt": "a red fox", "n": n}
            status, answer = await post(st, "/v1/images/generations", body)
            assert status == 400 and invalid(answer, "n"), (n, answer)
        assert st.cloud.requests == []
        body = {"model": "image-cloud", "prompt": "a red fox", "n": 2}
        status, _ = await post(st, "/v1/images/generations", body)
        assert status == 200


async def test_deeply_nested_json_is_a_400_in_openai_shape() -> None:
    async with stack() as st:
        deep = b'{"model": "frontier", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        for path in ("/v1/chat/completions", "/v1/embeddings", "/v1/images/generations"):
            status, answer = await post(st, path, deep)
            assert status == 400 and invalid(answer, None), (path, answer)
        assert st.cloud.requests == []


HUGE = 10**400  # a valid JSON integer, beyond any float
NAN, INF = float("nan"), float("inf")  # Python's json reads NaN and Infinity; JSON has neither

BAD_NUMBERS: list[tuple[str, str, Any]] = [
    ("chat", "max_tokens", HUGE),
    ("chat", "max_completion_tokens", HUGE),
    ("chat", "max_tokens", INF),
    ("chat", "n", HUGE),
    ("chat", "temperature", NAN),
    ("chat", "temperature", INF),
    ("chat", "temperature", HUGE),
    ("chat", "temperature", True),
    ("chat", "temperature", -0.5),
    ("chat", "temperature", "0.7"),
    ("chat", "top_p", 1.5),
    ("chat", "top_p", -INF),
    ("chat", "presence_penalty", NAN),
    ("chat", "frequency_penalty", -HUGE),
    ("chat", "seed", HUGE),
    ("chat", "seed", 2.5),
    ("chat", "top_logprobs", HUGE),
    ("chat", "top_logprobs", -1),
    ("chat", "logit_bias", {"50256": NAN}),
    ("chat", "logit_bias", {"50256": 101}),
    ("embeddings", "dimensions", HUGE),
    ("embeddings", "dimensions", 0),
    ("embeddings", "dimensions", False),
    ("images", "n", HUGE),
    ("images", "n", NAN),
    ("images", "size", "1" + "0" * 400 + "x1024"),
]
MODELS = {"chat": "frontier", "embeddings": "embed-cloud", "images": "image-cloud"}
PATHS = {
    "chat": "/v1/chat/completions",
    "embeddings": "/v1/embeddings",
    "images": "/v1/images/generations",
}


def request_body(kind: str, name: str, value: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODELS[kind], name: value}
    body.update({"chat": {"messages": HELLO}, "embeddings": {"input": "hi"}}.get(kind, {}))
    if kind == "images":
        body["prompt"] = "a red fox"
    return body


async def test_numbers_out_of_range_nan_infinity_and_huge_are_a_400_naming_the_field(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="warmgate.access")
    async with stack() as st:
        for kind, name, value in BAD_NUMBERS:
            raw = json.dumps(request_body(kind, name, value)).encode()
            status, answer = await post(st, PATHS[kind], raw)
            assert status == 400 and invalid(answer, name), (kind, name, value, answer)
        assert st.cloud.requests == []
        assert st.api.budget.reserved == 0.0 and st.api.budget.spent == 0.0
        refused = await metric_value(st.wg.admin, "warmgate_requests_total", code="400")
        assert refused == len(BAD_NUMBERS)  # counted like any other request
        logged = [r.getMessage() for r in caplog.records if r.name == "warmgate.access"]
        assert sum(" 400 " in line for line in logged) == len(BAD_NUMBERS)
        good = {"model": "frontier", "messages": HELLO, "temperature": 0.2, "top_p": 1, "seed": 7}
        status, _ = await post(st, "/v1/chat/completions", good)
        assert status == 200  # the control: numbers in range pass


async def test_nan_or_infinity_anywhere_in_the_body_is_a_400_never_forwarded() -> None:
    async with stack() as st:
        for raw in (
            b'{"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi", "w": NaN}]}',
            b'{"model": "qwen3-8b", "messages": [], "extra": {"deep": [-Infinity]}}',
            b'{"model": "qwen3-8b", "messages": [], "extra": 1e400}',
        ):
            status, answer = await post(st, "/v1/chat/completions", raw)
            assert status == 400 and answer["error"]["type"] == "invalid_request_error", raw
        assert st.local.requests == [] and st.cloud.requests == []
