"""warmgate's own access log as a trace (``warmgate simulate --from-access-log``): what would
another configuration have cost over the days this log covers?

A line (``router.routing.dispatch``; ``router.openai.api`` for the API), behind the logging
prefix ``warmgate serve`` writes (local time, as ``logging`` does)::

    2025-01-06 10:00:00,123 INFO warmgate.access 127.0.0.1 "POST /prompt" 200 target=comfyui 4.210s
    2025-01-06 10:00:02,001 INFO warmgate.access 127.0.0.1 "POST /v1/chat/completions" 200
        model=qwen decision="vllm; reason=ready" id=... 1.250s

The time logged is the answer's; the request arrived its duration earlier. Requests that change
something (POST, PUT, PATCH, DELETE) become ``render``, page loads (GET of ``/``, a path ending
in ``/`` or ``.html``) ``page``, API calls ``api``; other reads (assets, polls) and warmgate's own
pages are left out and counted. Each one's duration is its ``work_seconds`` (it includes any
wait for a cold start: the log does not tell them apart)."""

from __future__ import annotations

import datetime
import re
import zoneinfo
from collections.abc import Iterable
from dataclasses import dataclass, field

from router.simulate.trace import MAX_SPAN, Request, Trace, TraceError

_LINE = re.compile(
    r"^(?P<when>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[,.]\d+)?)\s+\S+\s+warmgate\.access\s+"
    r"(?P<remote>\S+)\s+\"(?P<method>[A-Z]+) (?P<path>[^\"]*)\"\s+(?P<status>\d{3})\s+(?P<rest>.*)$"
)
_TARGET = re.compile(r"(?:^|\s)target=(\S+)")
_MODEL = re.compile(r"(?:^|\s)model=(\S+)")
_SECONDS = re.compile(r"(?:^|\s)(\d+(?:\.\d+)?)s(?:\s|$)")
_CHANGES = ("POST", "PUT", "PATCH", "DELETE")


@dataclass(slots=True)
class Converted:
    trace: Trace
    left_out: dict[str, int] = field(default_factory=dict)
    """Why lines were not taken, and how many: ``not an access line``, ``read``, ``no target``."""


def _kind(method: str, path: str, model: str | None) -> str | None:
    if model is not None and model != "-":
        return "api"
    if method in _CHANGES:
        return "render"
    if method in ("GET", "HEAD"):
        bare = path.partition("?")[0]
        if bare == "/" or bare.endswith("/") or bare.endswith(".html"):
            return "page"
    return None


def convert(lines: Iterable[str], source: str = "<access log>", zone: str = "UTC") -> Converted:
    """The requests of an access log as a trace; ``zone``: the time zone its times were
    written in (the machine's local time: UTC in a container)."""
    tz = zoneinfo.ZoneInfo(zone)
    left: dict[str, int] = {}
    rows: list[tuple[float, Request]] = []
    for number, line in enumerate(lines, start=1):
        match = _LINE.match(line.strip())
        if match is None:
            if "warmgate.access" in line:
                left["not an access line"] = left.get("not an access line", 0) + 1
            continue
        rest = match.group("rest")
        target = _TARGET.search(rest)
        model = _MODEL.search(rest)
        model_name = model.group(1) if model else None
        target_name = target.group(1) if target else None
        path = match.group("path")
        if path.startswith("/.warmgate/") or (
            target_name in (None, "-") and model_name in (None, "-")
        ):
            left["warmgate's own or unrouted"] = left.get("warmgate's own or unrouted", 0) + 1
            continue
        kind = _kind(match.group("method"), path, model_name)
        if kind is None:
            left["reads (assets, polls)"] = left.get("reads (assets, polls)", 0) + 1
            continue
        seconds = _SECONDS.findall(rest)
        duration = float(seconds[-1]) if seconds else 0.0
        when = datetime.datetime.fromisoformat(match.group("when").replace(",", "."))
        answered = when.replace(tzinfo=tz).timestamp()
        arrived = answered - duration
        if kind == "api":
            request = Request(0.0, None, model_name, "api", duration, None, False, number)
        else:
            request = Request(0.0, target_name, None, kind, duration, None, False, number)
        rows.append((arrived, request))
    if not rows:
        return Converted(Trace((), 0.0, source), left)
    rows.sort(key=lambda row: row[0])
    origin = rows[0][0]
    if rows[-1][0] - origin > MAX_SPAN:
        raise TraceError(
            source, rows[-1][1].line, "time", f"the log spans more than {MAX_SPAN / 86400:g} days"
        )
    requests = tuple(
        Request(at - origin, r.target, r.model, r.kind, r.work_seconds, r.tokens, r.private, r.line)
        for at, r in rows
    )
    return Converted(Trace(requests, origin, source), left)
