"""The settings every property test of the suite shares: ``make test`` runs a few hundred
examples, derandomized (the same ones each run); ``make fuzz`` (``HYPOTHESIS_PROFILE=fuzz``)
runs many, at random."""

from __future__ import annotations

import os
from typing import Final

from hypothesis import HealthCheck, settings

FUZZ: Final = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"


def examples(fast: int, fuzz: int) -> settings:
    """Settings for ``fast`` examples under ``make test``, ``fuzz`` under ``make fuzz``."""
    return settings(
        max_examples=fuzz if FUZZ else fast,
        derandomize=not FUZZ,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
