"""Azar et al.'s optimal re-fetch rates and EDF schedule, against brute force and the paper's guarantee."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from crawlergate.regenerate.rates import change_rate, edf_schedule, freshness, optimal_rates, plan_window


def _brute_force(utilities: list[float], changes: list[float], budget: float) -> tuple[float, list[float]]:
    """The best of every support: for each subset of pages, the stationary point of the Lagrangian on it."""
    best = (-1.0, [0.0] * len(utilities))
    for size in range(1, len(utilities) + 1):
        for subset in itertools.combinations(range(len(utilities)), size):
            roots = sum(math.sqrt(utilities[i] * changes[i]) for i in subset)
            multiplier = (roots / (budget + sum(changes[i] for i in subset))) ** 2
            rates = [0.0] * len(utilities)
            for i in subset:
                rates[i] = math.sqrt(utilities[i] * changes[i] / multiplier) - changes[i]
            if min(rates) < -1e-12:
                continue
            value = freshness(utilities, changes, rates)
            if value > best[0]:
                best = (value, rates)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_rates_match_a_brute_force_optimum_on_small_random_instances(seed: int) -> None:
    generator = random.Random(seed)
    count = generator.randint(1, 6)
    utilities = [generator.lognormvariate(0, 1.5) for _ in range(count)]
    changes = [generator.lognormvariate(0, 1.5) for _ in range(count)]
    budget = generator.uniform(0.05, 5 * count)
    rates = optimal_rates(utilities, changes, budget)
    best, best_rates = _brute_force(utilities, changes, budget)
    assert sum(rates) == pytest.approx(budget, abs=1e-9)
    assert rates == pytest.approx(best_rates, abs=1e-6)
    assert freshness(utilities, changes, rates) == pytest.approx(best, abs=1e-9)
    # No other way to spend the budget does better.
    for _ in range(200):
        weights = [generator.random() for _ in range(count)]
        other = [budget * weight / sum(weights) for weight in weights]
        assert freshness(utilities, changes, other) <= freshness(utilities, changes, rates) + 1e-12


def _brute_force_capped(utilities: list[float], changes: list[float], budget: float, cap: float) -> float:
    """The best of every assignment of each page to 0, the cap, or free, by the stationary point of the rest."""
    best = -1.0
    for states in itertools.product((0, 1, 2), repeat=len(utilities)):
        free = [i for i, state in enumerate(states) if state == 1]
        held = [i for i, state in enumerate(states) if state == 2]
        left = budget - cap * len(held)
        rates = [cap if state == 2 else 0.0 for state in states]
        if left < -1e-12 or (not free and abs(left) > 1e-9):
            continue
        if free:
            roots = sum(math.sqrt(utilities[i] * changes[i]) for i in free)
            multiplier = (roots / (left + sum(changes[i] for i in free))) ** 2
            for i in free:
                rates[i] = math.sqrt(utilities[i] * changes[i] / multiplier) - changes[i]
            if min(rates[i] for i in free) < -1e-12 or max(rates[i] for i in free) > cap + 1e-12:
                continue
        best = max(best, freshness(utilities, changes, rates))
    return best


@pytest.mark.parametrize("seed", range(30))
def test_capped_rates_match_a_brute_force_optimum(seed: int) -> None:
    generator = random.Random(1000 + seed)
    count = generator.randint(2, 5)
    utilities = [generator.lognormvariate(0, 1.5) for _ in range(count)]
    changes = [generator.lognormvariate(0, 1.5) for _ in range(count)]
    cap = generator.uniform(0.2, 2)
    budget = generator.uniform(0.1, cap * count * 0.95)
    rates = optimal_rates(utilities, changes, budget, cap=cap)
    assert sum(rates) == pytest.approx(budget, abs=1e-9) and max(rates) <= cap + 1e-12
    assert freshness(utilities, changes, rates) == pytest.approx(
        _brute_force_capped(utilities, changes, budget, cap), abs=1e-9
    )
    # A budget over every page's cap: all at the cap.
    assert optimal_rates(utilities, changes, cap * count + 1, cap=cap) == [cap] * count


def test_rates_give_nothing_to_pages_that_change_too_often_for_their_demand() -> None:
    # Page 2 is wanted as much as page 0 but changes 100 times as often: its μ/Δ is below λ.
    rates = optimal_rates([10.0, 1.0, 10.0], [0.5, 0.1, 50.0], budget=2.0)
    assert rates[2] == 0.0 and rates[0] > rates[1] > 0
    assert optimal_rates([0.0, 5.0], [1.0, 0.0], budget=3.0) == [0.0, 0.0]  # nobody asks; never changes
    assert optimal_rates([1.0], [1.0], budget=0.0) == [0.0]


@pytest.mark.parametrize("seed", range(10))
def test_edf_refreshes_each_page_at_its_rate_within_one_period(seed: int) -> None:
    generator = random.Random(seed)
    rates = optimal_rates(
        [generator.paretovariate(1.2) for _ in range(30)], [generator.uniform(0.01, 2) for _ in range(30)], budget=7.0
    )
    shares = [rate / 7.0 for rate in rates]
    steps = 2000
    order, credits = edf_schedule(shares, steps)
    assert None not in order  # the shares sum to 1: every step fetches a page
    fetched = [0] * len(shares)
    last = [0] * len(shares)
    for step, page in enumerate(order, start=1):
        assert page is not None
        fetched[page] += 1
        # Within a gap of one period of its rate a page comes up (|t ρ - N(t)| ≤ 1 at every step).
        if last[page]:
            assert step - last[page] <= 2 / shares[page] + 1e-9
        last[page] = step
        for k, share in enumerate(shares):
            assert abs(step * share - fetched[k]) <= 1 + 1e-9
    assert all(share == 0 or abs(steps * share - fetched[k]) <= 1 for k, share in enumerate(shares))
    assert credits == pytest.approx([steps * share - fetched[k] for k, share in enumerate(shares)], abs=1e-9)


def test_edf_carries_on_across_windows_through_its_credits() -> None:
    shares = [0.5, 0.3, 0.15, 0.05]
    whole, _ = edf_schedule(shares, 60)
    first, credits = edf_schedule(shares, 25)
    second, _ = edf_schedule(shares, 35, credits)
    counts = [sum(1 for page in first + second if page == k) for k in range(4)]
    assert [abs(60 * share - count) <= 1 for share, count in zip(shares, counts, strict=True)] == [True] * 4
    assert sorted(map(str, first + second)) == sorted(map(str, whole))


def test_change_rate_estimate_follows_what_refetches_found() -> None:
    day = 86400.0
    never_seen = change_rate(0, 0, 0.0) * day
    assert 0.3 < never_seen < 0.5  # the prior: a one-in-three chance of a change within a day
    steady = change_rate(30, 0, 30 * day) * day
    busy = change_rate(30, 30, 30 * day) * day
    assert steady < 0.05 < never_seen < busy
    halves = change_rate(100, 39, 100 * day) * day  # a page changing at 0.5/day is found changed 1 - e^-0.5 = 39 %
    assert halves == pytest.approx(0.5, rel=0.1)


def test_a_window_fetches_distinct_pages_and_the_rest_of_the_schedule_waits() -> None:
    shares = [0.7, 0.2, 0.1]  # page 0 comes up more than once in any three steps
    plan = plan_window(shares, 3, [0.0, 0.0, 0.0])
    assert sorted(plan.picked) == [0, 1, 2] and len(plan.order) > 3
    # Only the first page fetched (the pass stopped): the steps before the second page's turn count, no more.
    partial = plan.credits_after(shares, [0.0] * 3, 1)
    steps = plan.order.index(plan.picked[1])
    assert partial == pytest.approx([steps * share - plan.order[:steps].count(k) for k, share in enumerate(shares)])
    assert plan_window([0.0, 0.0], 5, [0.0, 0.0]).picked == []
