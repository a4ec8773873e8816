"""The daily cloud budget: reserve at admission, settle from the actual usage.

A request sent to the cloud first reserves its estimated cost (an upper bound: see
:mod:`router.openai.costs`); reservations count against the day at once, so concurrent requests
cannot overspend it together. When the answer is done, the reservation is replaced by the actual
cost (or released when the call failed). The day rolls over at midnight UTC: the spend restarts at
zero, outstanding reservations carry over. The wall clock is injectable for tests.

With several warmgate replicas the day's limit is theirs together: ``others`` says what the other
replicas spent and reserved today, as last heard (docs/replicas.md).

The day survives a restart (:func:`kept`): the spend and the open reservations are written
through on every reservation and settle, and read back at start; reservations open when the
process died count as spent (the cloud may have charged them).

One event loop, no awaits inside: no locks needed.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from backends.documents import StateStore
from backends.outside import number, one_line
from router.scale.persist import Writer, read_back

log = logging.getLogger("warmgate.budget")

_EPSILON = 1e-9
"""Float slack: a reservation of exactly what is left fits."""


MODEL_POINTS = 288
"""Points kept per model on the day's spend line (one per :data:`POINT_EVERY` at most)."""
POINT_EVERY = 300.0
"""Seconds: spend settled within this of the last point moves that point instead of adding one."""
MOST_USD = 1e12
"""A day's kept spend at most: more was not written by warmgate (a state document is outside)."""
MODEL_LINES = 1000
"""Models whose spend line is read back at most; a longer list was not written by warmgate."""
MODEL_CHARS = 200
"""Characters of a kept model name read back (a name comes from the file: one bounded line)."""


@dataclass(slots=True)
class Reservation:
    amount: float
    cloud: str
    settled: bool = False
    model: str = ""
    """The API model it was made for (the spend per model); empty: not told."""


def utc_day(timestamp: float) -> datetime.date:
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).date()


def _next_midnight(day: datetime.date) -> float:
    start = datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC)
    return (start + datetime.timedelta(days=1)).timestamp()


class Budget:
    def __init__(
        self,
        limit_usd: float,
        clock: Callable[[], float] = time.time,
        on_spend: Callable[[str, float], None] | None = None,
    ) -> None:
        self.limit = limit_usd
        self.clock = clock
        self.on_spend = on_spend
        """Called with (cloud, USD) for every settled cost (the spend metric)."""
        self.day = utc_day(clock())
        self._next_day_at = _next_midnight(self.day)
        self.spent = 0.0
        """USD settled today (UTC)."""
        self.reserved = 0.0
        """USD held by requests still running."""
        self.outstanding = 0
        self.others: Callable[[datetime.date], float] | None = None
        """USD the other warmgate replicas spent and reserved on a given day, as last heard."""
        self.on_change: Callable[[], None] | None = None
        """Called after every reservation and settle (the spend is written through)."""
        self.on_model_spend: Callable[[str, str, float], None] | None = None
        """Called with (cloud, model, USD) for every settled cost of a request for a model (the
        spend-per-model metric)."""
        self.by_model: dict[str, list[tuple[float, float]]] = {}
        """Model -> the day's spend line: (wall-clock time, USD settled so far today)."""

    def _roll(self) -> None:
        now = self.clock()
        if now < self._next_day_at:
            return
        today = utc_day(now)
        if today != self.day:
            self.day, self.spent = today, 0.0
            self.by_model = {}
        self._next_day_at = _next_midnight(today)

    def left(self) -> float:
        """USD still allowed today, outstanding reservations deducted (never below zero)."""
        self._roll()
        others = self.others(self.day) if self.others is not None else 0.0
        return max(0.0, self.limit - self.spent - self.reserved - others)

    def mine(self) -> tuple[datetime.date, float]:
        """This replica's day and its USD spent and reserved on it (what the others count)."""
        self._roll()
        return self.day, self.spent + self.reserved

    def reserve(self, amount: float, cloud: str, model: str = "") -> Reservation | None:
        """Hold ``amount`` USD for one request (for ``model``), or ``None`` when the day cannot
        afford it."""
        amount = max(0.0, amount)
        if amount > self.left() + _EPSILON:
            return None
        self.reserved += amount
        self.outstanding += 1
        self._changed()
        return Reservation(amount, cloud, model=model)

    def settle(self, reservation: Reservation, actual: float) -> None:
        """Replace the reservation by what the request actually cost; idempotent."""
        if reservation.settled:
            return
        reservation.settled = True
        self.reserved = max(0.0, self.reserved - reservation.amount)
        self.outstanding -= 1
        if self.outstanding == 0:
            self.reserved = 0.0  # no float dust left behind
        self._roll()
        actual = max(0.0, actual)
        self.spent += actual
        if actual and self.on_spend is not None:
            self.on_spend(reservation.cloud, actual)
        if actual and reservation.model:
            self._spent_on(reservation.model, actual)
            if self.on_model_spend is not None:
                self.on_model_spend(reservation.cloud, reservation.model, actual)
        self._changed()

    def _spent_on(self, model: str, usd: float) -> None:
        now = self.clock()
        line = self.by_model.setdefault(model, [])
        total = (line[-1][1] if line else 0.0) + usd
        if len(line) > 1 and now - line[-2][0] < POINT_EVERY:
            line[-1] = (now, total)  # within the same few minutes: the last point moves
        else:
            line.append((now, total))
        del line[:-MODEL_POINTS]

    def spend_by_model(self) -> dict[str, float]:
        """Model -> USD this replica settled for it today."""
        self._roll()
        return {model: round(line[-1][1], 6) for model, line in self.by_model.items() if line}

    def release(self, reservation: Reservation) -> None:
        """The call failed before costing anything."""
        self.settle(reservation, 0.0)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # -- what survives a restart ------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """Today's spend and what the open reservations hold, as kept in the state store."""
        self._roll()
        return {
            "day": self.day.isoformat(),
            "spent": round(self.spent, 9),
            "reserved": round(self.reserved, 9),
            "open_reservations": self.outstanding,
            "by_model": {
                model: [[round(t, 1), round(usd, 9)] for t, usd in line]
                for model, line in self.by_model.items()
            },
        }

    def restore(self, document: Mapping[str, Any]) -> bool:
        """Take today's spend from what a previous run of this replica kept: its open
        reservations count as spent. ``False`` (nothing taken) for another day or nonsense."""
        day, usd = spend_of(document)
        self._roll()
        if day != self.day or usd is None:
            return False
        self.spent += usd
        self._restore_lines(document.get("by_model"))
        return True

    def _restore_lines(self, kept: object) -> None:
        """The day's spend line per model, as kept (a record of an older warmgate has none)."""
        if not isinstance(kept, dict):
            return
        for model, line in list(kept.items())[:MODEL_LINES]:
            points = _points(line)
            if points:
                self.by_model[one_line(model, MODEL_CHARS)] = sorted(points)[-MODEL_POINTS:]


def _points(line: object) -> list[tuple[float, float]] | None:
    """A kept spend line, each time and amount a finite number in bounds; ``None`` otherwise."""
    if not isinstance(line, list):
        return None
    points = []
    for point in line[-MODEL_POINTS:]:
        if not isinstance(point, list) or len(point) != 2:
            return None
        t, usd = number(point[0], 0.0), number(point[1], 0.0, MOST_USD)
        if t is None or usd is None:
            return None
        points.append((t, usd))
    return points


def spend_of(document: Mapping[str, Any]) -> tuple[datetime.date | None, float | None]:
    """(day, USD spent and reserved) of a kept record; ``(None, None)`` for nonsense."""
    raw_day = document.get("day")
    if not isinstance(raw_day, str):
        return None, None
    try:
        day = datetime.date.fromisoformat(raw_day[:10])
    except ValueError:
        return None, None
    spent = number(document.get("spent", 0.0), 0.0, MOST_USD)  # 1e400, 10**400: nonsense
    reserved = number(document.get("reserved", 0.0), 0.0, MOST_USD)
    if spent is None or reserved is None:
        return None, None
    return day, spent + reserved


def kept(
    budget: Budget,
    store: StateStore,
    key: str = "budget",
    others: Callable[[str, datetime.date, float], None] | None = None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` that reads the day back from ``store`` at start (``key``: this
    replica's record) and writes it through from then on. ``others``: told the spend of every
    other record kept today (``budget.<name>``: replicas gone or still there)."""

    async def keep(app: web.Application) -> AsyncIterator[None]:
        restored = False

        def take(document: dict[str, Any]) -> bool:
            nonlocal restored
            restored = budget.restore(document)
            return restored or spend_of(document)[0] is not None  # another day: nothing to take

        await read_back(store, key, take, "the kept cloud spend")
        if restored:
            log.info(
                "today's cloud spend read back from %s: %.4f USD (%.4f left)",
                store.where,
                budget.spent,
                budget.left(),
            )
        if others is not None:
            today = budget.mine()[0]
            for name, record in (await store.load_all("budget.")).items():
                day, usd = spend_of(record)
                if name != key and day == today and usd is not None:
                    others(name.removeprefix("budget."), day, usd)
        writer = Writer(store, key)
        budget.on_change = lambda: writer.put(budget.record())
        try:
            yield
        finally:
            budget.on_change = None
            await writer.close()

    return keep
