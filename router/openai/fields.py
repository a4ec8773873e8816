"""The numbers of a request that its cost is reserved on, checked as OpenAI checks them: the
budget's estimate (``router.openai.costs``) reads them only as integers in range, and the body
goes to the cloud unchanged, so a value the estimate would not read as a lenient server does
(``100000.0``, ``"100000"``) must not pass. Pure; one check for every placement."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from router.openai.errors import InvalidRequest

MAX_IMAGES: Final = 10
"""Images one request may ask for (OpenAI's bound for ``n`` on images)."""
MAX_CHOICES: Final = 128
"""Choices one chat request may ask for (OpenAI's bound for ``n`` on chat)."""
_TOKEN_LIMITS: Final = ("max_completion_tokens", "max_tokens")


def _integer(body: Mapping[str, Any], name: str, low: int, high: int | None) -> None:
    value = body.get(name)
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        expected = f"an integer of at least {low}" if high is None else f"{low} to {high}"
        raise InvalidRequest(f"{name}: expected {expected}, not {value!r:.40}", param=name)
    if high is not None and value > high:
        raise InvalidRequest(f"{name}: expected {low} to {high}, not {value}", param=name)


def check_fields(kind: str, body: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidRequest` (400, naming the field) for a token limit or ``n`` that
    is not an integer in range."""
    if kind == "chat":
        for name in _TOKEN_LIMITS:
            _integer(body, name, 1, None)
        _integer(body, "n", 1, MAX_CHOICES)
    elif kind == "images":
        _integer(body, "n", 1, MAX_IMAGES)
