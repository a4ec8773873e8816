"""The daily cloud budget (reserve, settle, UTC rollover) and the cost estimates behind it."""

from __future__ import annotations

import datetime

import pytest

from router.config import Cost
from router.openai.budget import Budget, spend_of
from router.openai.costs import actual, estimate

MIDNIGHT = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC).timestamp()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_reservations_count_at_once_and_settle_to_the_actual_cost() -> None:
    spent: list[tuple[str, float]] = []
    budget = Budget(10.0, Clock(MIDNIGHT + 3600), on_spend=lambda c, usd: spent.append((c, usd)))
    first = budget.reserve(4.0, "managed")
    second = budget.reserve(4.0, "managed")
    assert first is not None and second is not None
    assert budget.left() == pytest.approx(2.0)
    assert budget.reserve(2.5, "managed") is None  # would overspend with the two outstanding
    budget.settle(first, 1.0)
    assert budget.left() == pytest.approx(5.0)
    budget.settle(first, 1.0)  # idempotent
    budget.release(second)
    assert budget.left() == pytest.approx(9.0)
    assert budget.spent == pytest.approx(1.0) and budget.reserved == 0.0
    assert spent == [("managed", 1.0)]


def test_many_concurrent_reservations_never_exceed_the_budget() -> None:
    budget = Budget(10.0, Clock(MIDNIGHT))
    granted = [r for r in (budget.reserve(1.0, "c") for _ in range(100)) if r is not None]
    assert len(granted) == 10
    for reservation in granted:
        budget.settle(reservation, 1.0)
    assert budget.spent == pytest.approx(10.0) and budget.left() == 0.0


def test_the_day_rolls_over_at_midnight_utc() -> None:
    clock = Clock(MIDNIGHT - 1.0)  # 23:59:59 UTC
    budget = Budget(5.0, clock)
    spent = budget.reserve(5.0, "c")
    assert spent is not None
    budget.settle(spent, 5.0)
    running = budget.reserve(0.0, "c")
    assert budget.left() == 0.0 and budget.reserve(0.01, "c") is None
    clock.now = MIDNIGHT
    assert budget.left() == 5.0 and budget.spent == 0.0
    assert running is not None
    budget.settle(running, 0.5)  # a request that straddled midnight counts for the new day
    assert budget.left() == pytest.approx(4.5)


def test_overspend_by_a_single_request_blocks_the_rest_of_the_day() -> None:
    budget = Budget(1.0, Clock(MIDNIGHT))
    reservation = budget.reserve(0.5, "c")
    assert reservation is not None
    budget.settle(reservation, 3.0)
    assert budget.left() == 0.0
    assert budget.reserve(0.0001, "c") is None


PRICES = Cost(input_per_mtok=3.0, output_per_mtok=15.0, per_image=0.04)


def test_a_chat_estimate_bounds_the_actual_cost() -> None:
    body = {"messages": [{"role": "user", "content": "hello " * 100}], "max_tokens": 200}
    reserved = estimate("chat", body, PRICES, assumed_output=1024)
    # the worst case the server could bill: a token per byte of input, max_tokens of output
    usage = {"prompt_tokens": 100, "completion_tokens": 200}
    assert actual("chat", usage, 0, PRICES) == pytest.approx((300 + 3000) / 1e6)
    assert reserved >= actual("chat", usage, 0, PRICES)  # type: ignore[operator]


def test_estimates_without_limits_use_the_assumed_output_and_count_choices() -> None:
    body = {"messages": [], "n": 2}
    assert estimate("chat", body, PRICES, assumed_output=1000) == pytest.approx(15.0 * 2000 / 1e6)
    assert estimate("images", {"n": 3}, PRICES, 0) == pytest.approx(0.12)
    assert estimate("embeddings", {"input": "abcd"}, PRICES, 0) == pytest.approx(12 / 1e6)
    assert actual("images", None, 2, PRICES) == pytest.approx(0.08)
    assert actual("chat", None, 0, PRICES) is None
    assert actual("embeddings", {"prompt_tokens": 10, "total_tokens": 10}, 0, PRICES) == (
        pytest.approx(30 / 1e6)
    )


def test_the_other_replicas_spend_of_the_same_day_counts_against_the_limit() -> None:
    clock = Clock(MIDNIGHT - 60.0)
    budget = Budget(10.0, clock)
    theirs = {datetime.date(2026, 2, 28): 7.0}  # what the other replicas spent yesterday
    budget.others = lambda day: theirs.get(day, 0.0)
    assert budget.left() == pytest.approx(3.0)
    assert budget.reserve(3.5, "c") is None
    granted = budget.reserve(2.0, "c")
    assert granted is not None and budget.mine() == (datetime.date(2026, 2, 28), 2.0)
    clock.now = MIDNIGHT  # a new day: theirs was yesterday's
    assert budget.left() == pytest.approx(8.0)  # the outstanding reservation carries over


@pytest.mark.parametrize(
    "kept",
    [
        {"spent": 10**400},
        {"spent": float("inf")},  # what json.loads makes of 1e400
        {"reserved": float("nan")},
        {"spent": True},
        {"spent": "12.5"},
        {"spent": -1.0},
        {"day": 20260301},
    ],
)
def test_a_kept_spend_out_of_range_is_refused(kept: dict[str, object]) -> None:
    budget = Budget(10.0, clock=Clock(MIDNIGHT + 60))
    document = {"day": "2026-03-01", "spent": 1.0, "reserved": 0.0, **kept}
    assert spend_of(document) == (None, None)
    assert budget.restore(document) is False and budget.spent == 0.0


def test_a_kept_spend_line_out_of_range_is_dropped() -> None:
    budget = Budget(10.0, clock=Clock(MIDNIGHT + 60))
    lines = {"m": [[MIDNIGHT + 1, 10**400]], "n": [[float("inf"), 1.0]], "o": [[MIDNIGHT, 0.5]]}
    document = {"day": "2026-03-01", "spent": 0.5, "reserved": 0.0, "by_model": lines}
    assert budget.restore(document) is True
    assert budget.spend_by_model() == {"o": 0.5}
