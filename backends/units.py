"""Human units in config files: durations (``30m``, ``1800s``, ``200ms``) and sizes (``100MiB``)."""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

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


def parse_duration(value: object) -> float:
    """Seconds from ``1.5``, ``"30m"``, ``"1800s"``, ``"200ms"``, ``"2h"``, ``"1d"``."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m, 200ms")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"expected a duration such as 30s, 5m, 200ms, got {value!r}")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    else:
        raise ValueError(f"expected a duration such as 30s, 5m, 200ms, got {value!r}")
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be a finite number of seconds, got {value!r}")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from ``1024``, ``"100MiB"``, ``"1GB"``, ``"512KiB"``."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 100MiB, 1GiB, 512KB")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        match = _SIZE.match(value)
        if not match:
            raise ValueError(f"expected a size such as 100MiB, 1GiB, 512KB, got {value!r}")
        size = int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()])
    else:
        raise ValueError(f"expected a size such as 100MiB, 1GiB, 512KB, got {value!r}")
    if size < 0:
        raise ValueError("a size cannot be negative")
    return size


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
