"""Reports how many examples the framer's differential fuzzing ran (``make fuzz``)."""

from __future__ import annotations

import sys
from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    fuzz = sys.modules.get("tests.http.test_framer_fuzz")
    examples: dict[str, int] = getattr(fuzz, "EXAMPLES", {})
    if examples:
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in sorted(examples.items()))
        total = sum(examples.values())
        terminalreporter.write_line(f"framer fuzz: {total:,} examples against h11 ({kinds})")
