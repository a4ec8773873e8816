"""The dashboard's small pieces of HTML, shared by its sections: escaping, moments and
durations (as the script keeps them current), and a definition list."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from router.dashboard import charts

Json = Mapping[str, Any]
READ_ONLY = "read-only: actions need admin.token_file in warmgate's config"

e = charts.e
span = charts.duration


def clock(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%H:%M:%S UTC")


def iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat(timespec="seconds")


def since(epoch: float | None, now: float) -> str:
    """A moment: its time, and how long ago (which the script keeps current)."""
    if epoch is None:
        return "-"
    return (
        f'<time datetime="{e(iso(epoch))}" data-epoch="{epoch}">{clock(epoch)}</time> '
        f'(<span class="ago" data-epoch="{epoch}">{span(now - epoch)} ago</span>)'
    )


def countdown(epoch: float, now: float) -> str:
    return f'<span class="countdown" data-epoch="{epoch}">{span(epoch - now)}</span>'


def dl(rows: Iterable[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"
