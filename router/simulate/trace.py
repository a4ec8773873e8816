"""A request trace for ``warmgate simulate``: CSV with a header (docs/simulate.md).

Columns: ``time`` (ISO 8601, or seconds from the start), ``target`` or ``model`` (one of them per
line), ``kind`` (``page``, ``render``, ``api``), ``work_seconds`` (GPU time the request keeps the
engine busy) or ``tokens`` (an API request's output tokens), and optionally ``private``; other
columns are read past (:attr:`Trace.ignored`). A bad line raises :class:`TraceError` naming the
file, the line number and the field. Pure: text in, requests out."""

from __future__ import annotations

import csv
import datetime
import io
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

KINDS = ("page", "render", "api")
COLUMNS = ("time", "target", "model", "kind", "work_seconds", "tokens", "private")
DEFAULT_START = datetime.datetime(2025, 1, 6, tzinfo=datetime.UTC)
"""Where a trace in seconds begins (a Monday, 00:00 UTC), unless ``--start`` says otherwise."""
EPOCH_FROM = 1e9
"""Seconds from this on (2001-09-09) are Unix time, not seconds from the start: a trace of 31
years is none anyone replays, a column of Unix timestamps is a common export."""
EPOCH_MS_FROM = 1e12
"""Numbers from this on are Unix time in milliseconds (JavaScript's ``Date.now()``): as seconds
they would be the year 33658."""
MAX_SPAN = 120 * 86400.0
"""Seconds from a trace's first request to its last (about four months). The replay's virtual
clock must count nanoseconds (asyncio's resolution) to its end and past it (idle windows, the
tail): a float does so below 2**24 s (194 days), and this leaves weeks for what follows."""
MAX_WORK = 86400.0
"""Seconds of GPU time one request may keep its engine busy (a day: longer is no request)."""
MAX_TOKENS = 10_000_000
"""Output tokens one API request may ask for."""
EARLIEST, LATEST = 0.0, 4102444800.0
"""Times a trace may name: from 1970 to 2100 (UTC), as the wall clock of its replay."""
MAX_REQUESTS = 1_000_000
"""Requests in one trace: reading them takes about 600 MB at the most (0.6 KB a request)."""
MAX_BYTES = 64 * 2**20
"""Bytes of a trace file, looked at before it is read: a million lines of about 60 bytes."""
_TRUE = ("1", "true", "yes", "y", "on")
_FALSE = ("", "0", "false", "no", "n", "off")


class TraceError(ValueError):
    def __init__(self, source: str, line: int, field: str, problem: str) -> None:
        where = f"line {line}, field {field!r}: " if line > 0 else ""  # 0: the file itself
        super().__init__(f"{source}: {where}{problem}")
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
    ignored: tuple[str, ...] = ()
    """Columns of the header that are none of :data:`COLUMNS`: read past."""

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
        if seconds >= EPOCH_MS_FROM:
            seconds /= 1000
        elif seconds < EPOCH_FROM:
            if seconds > MAX_SPAN:
                raise ValueError(f"expected at most {_days(MAX_SPAN)} from the start, got {text!r}")
            return seconds, None
        if seconds > LATEST:
            raise ValueError(f"expected a time before 2100, got {text!r}")
        return None, seconds
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"expected ISO 8601 (2025-01-06T09:30:00Z) or seconds, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    epoch = moment.timestamp()
    if not EARLIEST <= epoch <= LATEST:
        raise ValueError(f"expected a time from 1970 to 2100, got {text!r}")
    return None, epoch


def _days(seconds: float) -> str:
    return f"{seconds / 86400:g} days"


def _number(text: str, what: str, most: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or value > most:
        raise ValueError(f"expected {what} up to {most:g}, got {text!r}")
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
    if names:
        names[0] = names[0].removeprefix("\ufeff").strip()  # a BOM a spreadsheet wrote
    for name in names:
        if name in COLUMNS and names.count(name) > 1:
            raise TraceError(source, 1, name, "the column is named twice")
    ignored = tuple(name for name in names if name not in COLUMNS)
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
        if len(rows) >= MAX_REQUESTS:
            raise TraceError(
                source, number, "time", f"a trace may hold {MAX_REQUESTS:,} requests: split it"
            )
        if len(row) != len(names):
            field = names[min(len(row), len(names) - 1)]
            raise TraceError(source, number, field, f"expected {len(names)} fields, got {len(row)}")
        cells = {n: c.strip() for n, c in zip(names, row, strict=True) if n in COLUMNS}
        rows.append(_row(cells, source, number))
    epochs = [epoch for _, epoch, _ in rows if epoch is not None]
    if epochs and len(epochs) != len(rows):
        line = next(r.line for _, epoch, r in rows if epoch is None)
        raise TraceError(
            source, line, "time", "mixes seconds from the start with times (ISO 8601, Unix)"
        )
    origin = min(epochs) if epochs else start.timestamp()
    if epochs and (last := max(epochs)) - origin > MAX_SPAN:
        line = next(r.line for _, epoch, r in rows if epoch == last)
        raise TraceError(
            source, line, "time", f"the trace spans more than {_days(MAX_SPAN)}: split it"
        )
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
    return Trace(tuple(requests), origin, source, ignored)


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
            work = _number(cells["work_seconds"], "seconds >= 0", MAX_WORK)
        except ValueError as exc:
            raise fail("work_seconds", str(exc)) from None
    if cells.get("tokens"):
        try:
            count = _number(cells["tokens"], "a whole number of tokens >= 0", MAX_TOKENS)
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


def check_names(
    trace: Trace, targets: Collection[str], models: Collection[str], config: str
) -> None:
    """Every request names a target or a model of ``config`` (its file, for the error):
    otherwise the first that does not raises :class:`TraceError` with its line and field."""
    for r in trace.requests:
        field, name, known = (
            ("target", r.target, targets) if r.target is not None else ("model", r.model, models)
        )
        if name is not None and name not in known:
            what = "targets" if field == "target" else "models"
            has = ", ".join(sorted(known)) or "none"
            raise TraceError(
                trace.source,
                r.line,
                field,
                f"unknown {field} {name!r} ({config} has {what}: {has})",
            )


def read(path: str | Path, start: datetime.datetime = DEFAULT_START) -> Trace:
    file = Path(path)
    try:
        size = file.stat().st_size
        if size > MAX_BYTES:
            raise TraceError(
                str(file),
                0,
                "(file)",
                f"is {size / 2**20:.0f} MiB; a trace may be {MAX_BYTES // 2**20} MiB "
                f"({MAX_REQUESTS:,} requests): split it or sample it",
            )
        with file.open(encoding="utf-8-sig", newline="") as handle:
            return parse(handle, str(file), start)
    except OSError as exc:
        raise TraceError(str(file), 0, "(file)", f"cannot be read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise TraceError(str(file), 0, "(file)", f"is not UTF-8 text: {exc.reason}") from exc


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
