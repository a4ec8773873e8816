"""The numbers a request's cost is reserved on (``max_tokens``, ``max_completion_tokens``, ``n``)
are checked as OpenAI checks them, for every placement: a value the estimate would not read as
the cloud does is refused with 400, and nothing reaches the cloud. A body nested too deep to
parse is a 400 too, never a 500."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

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
