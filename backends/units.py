"""Human units in config files: durations (``30m``, ``1800s``, ``200ms``) and sizes (``100MiB``)."""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import BeforeValidator, PlainSerializer

from backends.outside import number

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

MAX_DURATION: Final = 3650 * 86400.0
"""Ten years, the longest duration a config key or header takes: longer is a typo, and a timer
of 1e300 s overflows the event loop's clock arithmetic (uvloop counts in 64-bit ms)."""
MAX_SIZE: Final = 2**50
"""1 PiB, the largest size a config key takes."""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _negative(value: float) -> bool:
    return number(value) is not None and value < 0


def parse_duration(value: object) -> float:
    """Seconds from ``1.5``, ``"30m"``, ``"1800s"``, ``"200ms"``, ``"2h"``, ``"1d"``: finite,
    0 to :data:`MAX_DURATION` (a bool, NaN, an integer beyond the float range are refused)."""
    given = value
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"expected a duration such as 30s, 5m, 200ms, got {value!r:.60}")
        value = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected a duration such as 30s, 5m, 200ms")
    if _negative(value):
        raise ValueError("a duration cannot be negative")
    seconds = number(value, 0, MAX_DURATION)
    if seconds is None:
        raise ValueError(f"expected a finite duration of 0 to 3650d (ten years), got {given!r:.60}")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from ``1024``, ``"100MiB"``, ``"1GB"``, ``"512KiB"``: 0 to :data:`MAX_SIZE`."""
    given = value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if not match:
            raise ValueError(f"expected a size such as 100MiB, 1GiB, 512KB, got {value!r:.60}")
        value = float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()]
    elif isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a size such as 100MiB, 1GiB, 512KB, got {value!r:.60}")
    if _negative(value):
        raise ValueError("a size cannot be negative")
    size = number(value, 0, MAX_SIZE)
    if size is None:
        raise ValueError(f"expected a size of 0 to 1PiB, got {given!r:.60}")
    return int(size)


def format_duration(seconds: float) -> str:
    if seconds < 1 and seconds != 0:
        return f"{seconds * 1000:g}ms"
    for unit, factor in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= factor and seconds % factor == 0:
            return f"{seconds / factor:g}{unit}"
    return f"{seconds:g}s"


def format_size(size: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"


Duration = Annotated[
    float, BeforeValidator(parse_duration), PlainSerializer(format_duration, return_type=str)
]
"""Seconds, written in config as ``30m``, ``1800s`` or ``200ms``."""

Size = Annotated[int, BeforeValidator(parse_size), PlainSerializer(format_size, return_type=str)]
"""Bytes, written in config as ``100MiB`` or ``1GB``."""


def _figure(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def integer(lo: int, hi: int) -> BeforeValidator:
    """A config key that is an integer from ``lo`` to ``hi``, written as a number (a bool, a
    fraction, a string, an integer beyond the bounds are refused with one line)."""

    def take(value: object) -> int:
        if not isinstance(value, int) or number(value, lo, hi) is None:
            raise ValueError(
                f"expected an integer from {_figure(lo)} to {_figure(hi)}, got {value!r:.60}"
            )
        return value

    return BeforeValidator(take)


def real(lo: float, hi: float, *, above: bool = False) -> BeforeValidator:
    """A config key that is a finite number from ``lo`` (excluded when ``above``) to ``hi``
    (a bool, a string, NaN, an infinity, an integer beyond the float range are refused)."""
    low = f"above {_figure(lo)}" if above else f"from {_figure(lo)}"

    def take(value: object) -> float:
        taken = number(value, lo, hi)
        if taken is None or (above and taken == lo):
            raise ValueError(f"expected a number {low} to {_figure(hi)}, got {value!r:.60}")
        return taken

    return BeforeValidator(take)


PORT: Final = integer(1, 65535)
"""A TCP port."""
MAX_COUNT: Final = 2**31 - 1
"""The largest count a config key takes (connections, held requests, tokens): a 32-bit int."""
MAX_USD: Final = 1e9
"""The largest price or budget a config key takes, in USD."""
