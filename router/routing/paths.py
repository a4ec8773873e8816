"""A request path as routes see it: RFC 3986's remove_dot_segments (5.2.4) over the raw path,
a percent-encoded dot (``%2e``) read as a dot, so that ``/demo/../secret`` or
``/demo/%2e%2e/secret`` is ``/secret`` before any route matches, and never reaches an upstream
as ``/base/../secret`` (which a normalizing upstream serves as ``/secret``). Pure."""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote

_ENCODED_DOT: Final = re.compile("%2e", re.IGNORECASE)
_SEPARATORS: Final = re.compile(r"[/\\]")
_DOT_SEGMENTS: Final = frozenset((".", ".."))


def _hides_dot_segment(segment: str) -> bool:
    """``segment`` decodes to something with a dot segment between slashes or backslashes
    (``..%2f``, ``..\\``, ``%2e%2e%5c``): an engine that decodes before it normalizes, or reads
    a backslash as a slash, would climb out with it."""
    parts = _SEPARATORS.split(unquote(segment))
    return len(parts) > 1 and any(part in _DOT_SEGMENTS for part in parts)


def normalize_path(path: str) -> str | None:
    """``path`` (raw, absolute, without its query) with its dot segments removed; ``None`` when
    a segment hides one (see :func:`_hides_dot_segment`): such a request is refused."""
    if "." not in path and "%" not in path and "\\" not in path:
        return path  # nothing to remove: the common case, without a split
    out: list[str] = []
    last_was_dot = False
    for segment in path.split("/")[1:]:
        plain = _ENCODED_DOT.sub(".", segment) if "%" in segment else segment
        last_was_dot = plain in _DOT_SEGMENTS
        if plain == "..":
            if out:
                out.pop()
        elif not last_was_dot:
            if _hides_dot_segment(segment):
                return None
            out.append(segment)
    normalized = "/" + "/".join(out)
    return normalized + "/" if last_was_dot and not normalized.endswith("/") else normalized
