"""Reports how many examples the hostile ``state_dir`` fuzzing ran (``make fuzz``)."""

from __future__ import annotations

import sys
from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    ran = getattr(sys.modules.get("tests.scale.test_state_fuzz"), "RAN", {})
    if ran.get("examples"):
        terminalreporter.write_line(
            f"state_dir fuzz: {ran['examples']:,} examples, "
            f"{ran['refused']:,} documents ignored with a warning"
        )
