"""JSON out that is always JSON: a float that is not finite (``inf`` from a learned figure read
from a tampered document, or a sum that overflowed) is written as ``null``, never as the
``Infinity`` or ``NaN`` that Python's json writes and no JSON parser reads."""

from __future__ import annotations

import json
import math
from typing import Any


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def finite(value: float | None) -> float | None:
    """``value``, or ``None`` when it is no finite number."""
    return value if value is None or math.isfinite(value) else None


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` with non-finite floats as ``null`` (walked only when there is one)."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False, **options)
