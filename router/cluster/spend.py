"""The day's cloud budget, shared by the warmgate replicas (docs/replicas.md): each replica
reports what it spent and reserved on its UTC day, and counts the others' as last heard; the
spend of a replica gone today stays spent (the others pass it on to replicas that come later).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable
from typing import Any, Final, Protocol

from backends.outside import number


class SharedBudget(Protocol):
    """What the replicas need of the day's cloud budget (the OpenAI API's)."""

    others: Callable[[datetime.date], float] | None
    """Set by the replicas: USD the others spent and reserved on a given day, as last heard."""

    def mine(self) -> tuple[datetime.date, float]:
        """This replica's day and its USD spent and reserved on it."""
        ...


class Spend:
    """The others' spend as this replica heard it; this one's, to report."""

    def __init__(self, identity: str, answers: Callable[[str], bool]) -> None:
        self.identity = identity
        self._answers = answers
        """Whether the replica of that name has answered this one itself (then its own word
        on its spend is the one that counts)."""
        self.budget: SharedBudget | None = None
        """The day's cloud budget, when the OpenAI API is served: shared with the others."""
        self.by_replica: dict[str, tuple[datetime.date, float]] = {}
        """USD each other replica spent and reserved, by its name: (day, USD) as last heard;
        kept after the replica is gone (what it spent today stays spent)."""

    def share(self, budget: SharedBudget) -> None:
        self.budget = budget
        budget.others = self.others

    def others(self, day: datetime.date) -> float:
        return sum(usd for on, usd in self.by_replica.values() if on == day)

    def forget_days_gone(self) -> None:
        """A day gone by is nobody's spend any more."""
        if self.budget is not None:
            today = self.budget.mine()[0]
            self.by_replica = {n: (d, usd) for n, (d, usd) in self.by_replica.items() if d >= today}

    def heard(self, replica: str, data: Any) -> None:
        """A replica's report of its spend (and of the spend it remembers of others); raises
        ``ValueError`` on nonsense (a spend that is negative or not a finite number too)."""
        problem = spend_problem(data)
        if problem is not None:
            raise ValueError(problem)
        if not isinstance(data, dict) or "day" not in data:
            return
        day = datetime.date.fromisoformat(str(data["day"]))
        self.by_replica[replica] = (day, float(data.get("usd") or 0.0))  # its word
        for name, (on, usd) in _spend_from_json(data.get("remembered")).items():
            self._remember(name, on, usd)  # replicas gone before this one came

    def remember(self, name: str, day: datetime.date, usd: float) -> None:
        """Another replica's spend as kept at its last write (read back at start, from the
        state store): counted like a third replica's word, until that replica answers."""
        self._remember(name, day, usd)

    def _remember(self, name: str, day: datetime.date, usd: float) -> None:
        """Another replica's spend as a third one remembers it: the highest word wins, and
        never over the replica's own (while it is heard) or this one's (echoed back)."""
        if name == self.identity or self._answers(name):
            return
        known = self.by_replica.get(name)
        if known is None or known[0] < day or (known[0] == day and known[1] < usd):
            self.by_replica[name] = (day, usd)

    def to_json(self) -> dict[str, Any] | None:
        """This replica's report: its own spend and what it remembers of the others'."""
        if self.budget is None:
            return None
        day, usd = self.budget.mine()
        remembered = {
            name: {"day": on.isoformat(), "usd": round(spent, 6)}
            for name, (on, spent) in self.by_replica.items()
        }
        return {"day": day.isoformat(), "usd": round(usd, 6), "remembered": remembered}


MAX_SPEND: Final = 1e12
"""The most USD a replica's word on a day's spend may say: more is no answer."""


def _usd_problem(value: Any, at: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{at}: expected a number of USD, got {value!r:.40}"
    if number(value, 0, MAX_SPEND) is None:  # also NaN, infinities, a 401-digit integer
        return f"{at}: expected a finite number of USD, 0 to 1e12, got {value!r:.40}"
    return None


def spend_problem(data: Any) -> str | None:
    """What is wrong with the ``budget`` part of a replica's report, or ``None``: a spend that
    is negative or not finite would lift (or void) the replicas' shared daily budget. Pure."""
    if data is None:
        return None
    if not isinstance(data, dict):
        return "budget: expected an object {day, usd, remembered}"
    try:
        datetime.date.fromisoformat(str(data.get("day")))
    except ValueError:
        return f"budget.day: expected a date such as 2030-01-01, got {data.get('day')!r}"
    problem = _usd_problem(data.get("usd", 0.0), "budget.usd")
    remembered = data.get("remembered") or {}
    if problem is None and not isinstance(remembered, dict):
        return "budget.remembered: expected an object of replica -> {day, usd}"
    for name, entry in remembered.items():
        if problem is not None:
            break
        usd = entry.get("usd") if isinstance(entry, dict) else entry
        problem = _usd_problem(usd, f"budget.remembered.{name}.usd")
    return problem


def _spend_from_json(data: Any) -> dict[str, tuple[datetime.date, float]]:
    out: dict[str, tuple[datetime.date, float]] = {}
    if isinstance(data, dict):
        for name, entry in data.items():
            with contextlib.suppress(KeyError, TypeError, ValueError):
                out[str(name)] = (datetime.date.fromisoformat(entry["day"]), float(entry["usd"]))
    return out
