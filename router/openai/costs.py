"""What a cloud request may cost (reserved before it is sent) and what it did cost (settled
from the usage the cloud reports). Pure functions over the request and response JSON.

The estimate is an upper bound where one is known: input tokens are bounded by the request's
size in bytes (a token is at least one byte), output tokens by ``max_tokens`` /
``max_completion_tokens``, or ``policy.assumed_output_tokens`` when the client gave no limit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.outside import count
from router.config import Cost

_MTOK = 1_000_000


def _input_bytes(value: object) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, int):
        return 1  # a token id
    return len(json.dumps(value, ensure_ascii=False).encode())


def _output_limit(body: Mapping[str, Any], assumed: int) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return assumed


def _choices(body: Mapping[str, Any]) -> int:
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


@dataclass(frozen=True, slots=True)
class Bound:
    """The most one request can use: what its reservation is priced from. Computed once per
    request (the body does not change between placements or a fallback)."""

    input_tokens: int = 0
    output_tokens: int = 0
    images: int = 0

    def price(self, cost: Cost) -> float:
        """USD to reserve at ``cost``."""
        tokens = cost.input_per_mtok * self.input_tokens + cost.output_per_mtok * self.output_tokens
        return tokens / _MTOK + cost.per_image * self.images


def bound(kind: str, body: Mapping[str, Any], assumed_output: int) -> Bound:
    if kind == "images":
        return Bound(images=_choices(body))
    if kind == "embeddings":
        return Bound(input_tokens=_input_bytes(body.get("input", "")))
    prompt = sum(_input_bytes(body[key]) for key in ("messages", "tools") if body.get(key))
    return Bound(prompt, _output_limit(body, assumed_output) * _choices(body))


def estimate(kind: str, body: Mapping[str, Any], cost: Cost, assumed_output: int) -> float:
    """USD to reserve for this request at ``cost``."""
    return bound(kind, body, assumed_output).price(cost)


def actual(kind: str, usage: Mapping[str, Any] | None, images: int, cost: Cost) -> float | None:
    """USD from the cloud's ``usage`` (or the number of images); ``None`` when unknown."""
    if kind == "images":
        return cost.per_image * images
    if not isinstance(usage, Mapping):
        return None
    # the cloud's own figures, from outside: a count that is none (NaN, 1e400) is no answer
    prompt = count(usage.get("prompt_tokens", usage.get("input_tokens", 0)))
    completion = count(usage.get("completion_tokens", usage.get("output_tokens", 0)))
    if prompt is None or completion is None:
        return None
    return (cost.input_per_mtok * prompt + cost.output_per_mtok * completion) / _MTOK
