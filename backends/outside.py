"""The one door for what the outside says: text an engine, a pod, a peer or a state file wrote,
and the numbers they send. Text is made one bounded, printable line where it enters; numbers are
taken with their bounds (finite, in range; a bool is not a number), else they are no answer.

Only the forms these functions return travel on (pages, JSON answers, the dashboard, metric
labels, log records): a page escapes markup, but a log line or a JSON encoder cannot undo a raw
CR/LF, an ESC, or a lone surrogate (which no UTF-8 encoder writes).
"""

from __future__ import annotations

import math
import re
import sys
from typing import Final

ERROR_CHARS: Final = 300
"""Most characters of outside text kept (an engine's failure, a stage message, a pod event)."""

_UNPRINTABLE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]+"
)
"""Control characters (C0, DEL, C1), line and paragraph separators, bidi overrides, a BOM and
lone surrogates: none may reach a log line or an encoder."""

_SPACES: Final = re.compile(r"\s+")


def one_line(text: object, limit: int = ERROR_CHARS) -> str:
    """``text`` (any value: a ``str`` as it is, anything else as ``str()`` gives it) as one
    printable line: whitespace runs and unprintable characters become one space, the ends are
    stripped, and the line is cut to ``limit`` characters (the last one an ellipsis)."""
    if not isinstance(text, str):
        text = str(text)
    text = text[: 8 * limit]  # the rest is cut before any work on it
    line = _SPACES.sub(" ", _UNPRINTABLE.sub(" ", text)).strip()
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def number(
    value: object, lo: float = -sys.float_info.max, hi: float = sys.float_info.max
) -> float | None:
    """A number from outside within ``[lo, hi]`` as a float; ``None`` (no answer) for a bool, a
    non-number, NaN, an infinity, an integer beyond the float range, or a value out of bounds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):  # compared as an integer: a 401-digit one never meets float()
        return float(value) if lo <= value <= hi else None
    return value if math.isfinite(value) and lo <= value <= hi else None


class Refused(ValueError):
    """A number from outside that is no answer (out of its bounds, not finite, a bool); ``field``
    is the name the code gives it (a fixed set, never outside text: it may become a label)."""

    def __init__(self, field: str) -> None:
        super().__init__(f"{field}: not a number within its bounds")
        self.field = field


def taken(value: object, field: str, lo: float, hi: float) -> float:
    """``number(value, lo, hi)``, or :class:`Refused` naming ``field``."""
    result = number(value, lo, hi)
    if result is None:
        raise Refused(field)
    return result


def count(value: object, hi: int = 2**31 - 1) -> int | None:
    """A count from outside (a queue's length, a number of jobs): an integer in ``[0, hi]``, or
    a float that is one; ``None`` for anything else (a bool, a fraction, a negative number)."""
    taken = number(value, 0, hi)
    if taken is None or not float(taken).is_integer():
        return None
    return int(taken)
