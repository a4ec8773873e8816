"""A request trace for ``warmgate simulate``: CSV with a header (docs/simulate.md).

Columns: ``time`` (ISO 8601, or seconds from the start), ``target`` or ``model`` (one of them per
line), ``kind`` (``page``, ``render``, ``api``), ``work_seconds`` (GPU time the request keeps the
engine busy) or ``tokens`` (an API request's output tokens), and optionally ``private``. A bad line
raises :class:`TraceError` naming the file, the line number and the field. Pure: text in,
requests out."""

from __future__ import annotations

import csv
import datetime
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

KINDS = ("page", "render", "api")
COLUMNS = ("time", "target", "model", "kind", "work_seconds", "tokens", "private")
DEFAULT_START = datetime.datetime(2025, 1, 6, tzinfo=datetime.UTC)
"""Where a trace in seconds begins (a Monday, 00:00 UTC), unless ``--start`` says otherwise."""
_TRUE = ("1", "true", "yes", "y")
_FALSE = ("", "0", "false", "no", "n")


class TraceError(ValueError):
    def __init__(self, source: str, line: int, field: str, problem: str) -> None:
        super().__init__(f"{source}: line {line}, field {field!r}: {problem}")
        self.source, self.line, self.field, self.problem = source, line, field, problem


@dataclass(frozen=True, slots=True)
class Request:
    at: float
    """Seconds from the trace's start."""
    target: str | None
    model: str | None
    kind: str
    work_seconds: float | None
    tokens: int | None
    private: bool
    line: int


@dataclass(frozen=True, slots=True)
class Trace:
    requests: tuple[Request, ...]
    """Sorted by ``at`` (lines with the same time keep their order)."""
    start: float
    """Epoch seconds of ``at == 0``: the wall clock of the replay (``keep_warm``, the day)."""
    source: str

    @property
    def duration(self) -> float:
        return self.requests[-1].at if self.requests else 0.0


def _time(text: str) -> tuple[float | None, float | None]:
    """(seconds, epoch): exactly one is set."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"expected seconds >= 0 or an ISO 8601 time, got {text!r}")
        return seconds, None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"expected ISO 8601 (2025-01-06T09:30:00Z) or seconds, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return None, moment.timestamp()


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected {what}, got {text!r}")
    return value


def parse(
    text: str | Iterable[str],
    source: str = "<trace>",
    start: datetime.datetime = DEFAULT_START,
) -> Trace:
    """Read a trace. ``start``: the wall clock of a trace written in seconds."""
    lines = io.StringIO(text) if isinstance(text, str) else text
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        raise TraceError(source, 1, "time", "the trace is empty (expected a header line)")
    names = [name.strip().lower() for name in header]
    for name in names:
        if name not in COLUMNS:
            raise TraceError(source, 1, name, f"unknown column (expected {', '.join(COLUMNS)})")
    for needed in ("time", "kind"):
        if needed not in names:
            raise TraceError(source, 1, needed, "missing column")
    if "target" not in names and "model" not in names:
        raise TraceError(source, 1, "target", "needs a target or a model column")
    if "work_seconds" not in names and "tokens" not in names:
        raise TraceError(source, 1, "work_seconds", "needs a work_seconds or a tokens column")
    rows: list[tuple[float | None, float | None, Request]] = []
    for row in reader:
        number = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(names):
            field = names[min(len(row), len(names) - 1)]
            raise TraceError(source, number, field, f"expected {len(names)} fields, got {len(row)}")
        rows.append(_row(dict(zip(names, (c.strip() for c in row), strict=True)), source, number))
    epochs = [epoch for _, epoch, _ in rows if epoch is not None]
    if epochs and len(epochs) != len(rows):
        line = next(r.line for _, epoch, r in rows if epoch is None)
        raise TraceError(source, line, "time", "mixes ISO 8601 times and seconds")
    origin = min(epochs) if epochs else start.timestamp()
    requests = sorted(
        (
            Request(
                (seconds if seconds is not None else (epoch or 0.0) - origin),
                r.target,
                r.model,
                r.kind,
                r.work_seconds,
                r.tokens,
                r.private,
                r.line,
            )
            for seconds, epoch, r in rows
        ),
        key=lambda r: r.at,
    )
    return Trace(tuple(requests), origin, source)


def _row(
    cells: dict[str, str], source: str, line: int
) -> tuple[float | None, float | None, Request]:
    def fail(field: str, problem: str) -> TraceError:
        return TraceError(source, line, field, problem)

    try:
        seconds, epoch = _time(cells["time"])
    except ValueError as exc:
        raise fail("time", str(exc)) from None
    target = cells.get("target") or None
    model = cells.get("model") or None
    if (target is None) == (model is None):
        field = "target" if "target" in cells else "model"
        raise fail(field, "expected exactly one of target and model")
    kind = cells["kind"].lower()
    if kind not in KINDS:
        raise fail("kind", f"expected one of {', '.join(KINDS)}, got {cells['kind']!r}")
    if kind == "api" and model is None and target is None:
        raise fail("model", "an api request needs a model (or a target)")
    work = tokens = None
    if cells.get("work_seconds"):
        try:
            work = _number(cells["work_seconds"], "seconds >= 0")
        except ValueError as exc:
            raise fail("work_seconds", str(exc)) from None
    if cells.get("tokens"):
        try:
            count = _number(cells["tokens"], "a whole number of tokens >= 0")
        except ValueError as exc:
            raise fail("tokens", str(exc)) from None
        if count != int(count):
            raise fail("tokens", f"expected a whole number of tokens, got {cells['tokens']!r}")
        tokens = int(count)
    if work is None and tokens is None:
        field = "work_seconds" if "work_seconds" in cells else "tokens"
        raise fail(field, "expected work_seconds or tokens")
    private = cells.get("private", "").lower()
    if private not in _TRUE + _FALSE:
        raise fail("private", f"expected true or false, got {cells['private']!r}")
    request = Request(0.0, target, model, kind, work, tokens, private in _TRUE, line)
    return seconds, epoch, request


def read(path: str | Path, start: datetime.datetime = DEFAULT_START) -> Trace:
    file = Path(path)
    try:
        with file.open(encoding="utf-8", newline="") as handle:
            return parse(handle, str(file), start)
    except OSError as exc:
        raise TraceError(str(file), 0, "(file)", f"cannot be read: {exc.strerror}") from exc


def write(requests: Sequence[Request], start: float, handle: TextIO) -> None:
    """CSV with the full header, times in ISO 8601 (UTC, milliseconds)."""
    out = csv.writer(handle, lineterminator="\n")
    out.writerow(["time", "target", "model", "kind", "work_seconds", "tokens", "private"])
    for r in requests:
        moment = datetime.datetime.fromtimestamp(start + r.at, datetime.UTC)
        out.writerow(
            [
                moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                r.target or "",
                r.model or "",
                r.kind,
                "" if r.work_seconds is None else f"{r.work_seconds:g}",
                "" if r.tokens is None else r.tokens,
                "true" if r.private else "",
            ]
        )
