"""The numbers of a request, checked as OpenAI checks them, with their bounds: the budget's
estimate (``router.openai.costs``) reads the token limits and ``n`` only as integers in range,
and the body goes to the cloud (or a local server) unchanged, so a value that one of them would
read otherwise (``100000.0``, ``"100000"``, ``true``, NaN, a 401-digit integer) must not pass.
Pure; one check for every placement."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from backends.outside import number
from router.openai.errors import InvalidRequest

MAX_IMAGES: Final = 10
"""Images one request may ask for (OpenAI's bound for ``n`` on images)."""
MAX_CHOICES: Final = 128
"""Choices one chat request may ask for (OpenAI's bound for ``n`` on chat)."""
MAX_TOKENS: Final = 2**31 - 1
"""The largest token limit taken: what a 32-bit field of a model server holds; no model has a
context near it, and the budget's estimate stays a finite number of USD."""
SIZE: Final = re.compile(r"^(\d{2,4})x(\d{2,4})$")
"""An image's ``size``, ``WIDTHxHEIGHT`` (or ``auto``)."""


@dataclass(frozen=True, slots=True)
class Bounds:
    lo: float
    hi: float
    integer: bool = False

    def expected(self) -> str:
        kind = "an integer" if self.integer else "a number"
        return f"{kind} from {_figure(self.lo)} to {_figure(self.hi)}"


def _figure(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


_INT64: Final = Bounds(-(2**63), 2**63 - 1, integer=True)
_CHAT: Final = {
    "max_completion_tokens": Bounds(1, MAX_TOKENS, integer=True),
    "max_tokens": Bounds(1, MAX_TOKENS, integer=True),
    "n": Bounds(1, MAX_CHOICES, integer=True),
    "temperature": Bounds(0, 2),
    "top_p": Bounds(0, 1),
    "presence_penalty": Bounds(-2, 2),
    "frequency_penalty": Bounds(-2, 2),
    "top_logprobs": Bounds(0, 20, integer=True),
    "seed": _INT64,
}
_EMBEDDINGS: Final = {"dimensions": Bounds(1, 65536, integer=True)}
_IMAGES: Final = {
    "n": Bounds(1, MAX_IMAGES, integer=True),
    "seed": Bounds(0, 2**63 - 1, integer=True),  # seed + i, for n images, stays an int64
    "output_compression": Bounds(0, 100, integer=True),
    "partial_images": Bounds(0, 3, integer=True),
}
FIELDS: Final = {"chat": _CHAT, "embeddings": _EMBEDDINGS, "images": _IMAGES}
"""Each kind's numeric fields and their bounds (OpenAI's, where it documents one)."""
_LOGIT_BIAS: Final = Bounds(-100, 100)


def _shown(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**12:
        return f"an integer of {len(str(abs(value)))} digits"
    return f"{value!r:.40}"


def _check(name: str, value: object, bounds: Bounds) -> None:
    taken = number(value, bounds.lo, bounds.hi)
    if taken is None or (bounds.integer and not isinstance(value, int)):
        raise InvalidRequest(
            f"{name}: expected {bounds.expected()}, not {_shown(value)}", param=name
        )


def check_fields(kind: str, body: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidRequest` (400, naming the field) for a number the API reads that is
    not one (a bool, a string), not finite, not an integer where one is due, or out of bounds."""
    for name, bounds in FIELDS.get(kind, {}).items():
        value = body.get(name)
        if value is not None:
            _check(name, value, bounds)
    if kind == "chat" and (bias := body.get("logit_bias")) is not None:
        if not isinstance(bias, Mapping):
            message = "logit_bias: expected a map of token ids to numbers"
            raise InvalidRequest(message, param="logit_bias")
        for value in bias.values():
            _check("logit_bias", value, _LOGIT_BIAS)
    size = body.get("size") if kind == "images" else None
    if size not in (None, "auto") and (not isinstance(size, str) or SIZE.match(size) is None):
        raise InvalidRequest(
            f"size: expected WIDTHxHEIGHT such as 1024x1024, or auto, not {_shown(size)}",
            param="size",
        )
