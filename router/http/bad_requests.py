"""The log line of a request refused before any handler ran (malformed, or refused by
router.http.intake): one warning line each, without a traceback, at most ``LINES`` lines a
``WINDOW``; the next line after a quiet stretch says how many were left out."""

from __future__ import annotations

import logging
from typing import Final

log = logging.getLogger("warmgate")

LINES: Final = 5
"""Lines per window: enough to see what a client sends, too few to fill a disk."""
WINDOW: Final = 60.0
"""Seconds of one window."""


class BadRequestLog:
    """Counts what it does not write; ``now`` is the loop's clock."""

    __slots__ = ("_left_out", "_started", "_written")

    def __init__(self) -> None:
        self._started = float("-inf")
        self._written = 0
        self._left_out = 0

    def refused(self, now: float, client: str | None, status: int, why: str) -> None:
        if now - self._started >= WINDOW:
            self._started, self._written = now, 0
        if self._written >= LINES:
            self._left_out += 1
            return
        self._written += 1
        more = f" ({self._left_out} more left out of the log before it)" if self._left_out else ""
        self._left_out = 0
        log.warning("bad request from %s: %d %s%s", client or "-", status, why[:200], more)
