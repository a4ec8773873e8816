"""Reports how many examples the differential fuzzing ran (``make fuzz``): the upstream response
framer's and the request side's, each against h11."""

from __future__ import annotations

import sys
from typing import Any

FUZZERS = {
    "tests.http.test_framer_fuzz": "framer fuzz",
    "tests.http.test_request_fuzz": "request fuzz",
}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for module, title in FUZZERS.items():
        examples: dict[str, int] = getattr(sys.modules.get(module), "EXAMPLES", {})
        if examples:
            kinds = ", ".join(f"{kind} {count:,}" for kind, count in sorted(examples.items()))
            total = sum(examples.values())
            terminalreporter.write_line(f"{title}: {total:,} examples against h11 ({kinds})")
