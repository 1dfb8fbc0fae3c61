"""How often to re-fetch pages whose changes nobody announces: Azar et al. (2018), "Tractable near-optimal
policies for crawling".

A page i is asked for by crawlers at rate μ_i (its utility) and changes, unannounced, at rate Δ_i.
With a budget of R re-fetches per unit of time shared as rates ρ_i, the share of crawler requests
that get an up-to-date page is Σ μ_i ρ_i / (ρ_i + Δ_i) / Σ μ_i (their Problem 2). ``optimal_rates``
solves it exactly (their Algorithm 2, O(n log n)): a page whose μ_i/Δ_i is below the Lagrange
multiplier λ gets rate 0 (it changes too often for its demand to be worth the fetches), the others
ρ_i = √(μ_i Δ_i / λ) − Δ_i. ``edf_schedule`` turns rates into an order of fetches (their
Algorithm 3, earliest deadline first), which refreshes each page within one fetch of its rate at
every step and keeps better freshness than drawing pages at random. ``change_rate`` estimates Δ_i
from the page's own history of re-fetches (Cho and Garcia-Molina's estimator).

    rates = optimal_rates([9.0, 1.0], [0.5, 0.1], budget=1.0)
    order, credits = edf_schedule([rate / 1.0 for rate in rates], steps=10)
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

# A page never re-fetched is taken to have been seen once, half changed, over this long: a one-in-three
# chance of changing within a day. Without it a new page's estimate is 0 and it would never be re-fetched.
PRIOR_INTERVAL_S = 86400.0


def optimal_rates(
    utilities: Sequence[float], change_rates: Sequence[float], budget: float, *, cap: float | None = None
) -> list[float]:
    """The re-fetch rates (summing to ``budget``) that maximise Σ μ_i ρ_i / (ρ_i + Δ_i) (Azar et al., Problem 2).

    A page nobody asks for (μ_i = 0) or that never changes (Δ_i = 0) gets rate 0. ``cap`` bounds each rate
    (a page is fetched at most once a window): the pages whose optimal rate exceeds it are held at it and the
    rest of the budget is shared again, until none does (exact, since the objective is concave and separable:
    holding pages at the cap only lowers the multiplier, so no rate falls back below it).
    """
    rates = [0.0] * len(utilities)
    active = [i for i, (mu, delta) in enumerate(zip(utilities, change_rates, strict=True)) if mu > 0 and delta > 0]
    if budget <= 0 or not active:
        return rates
    if cap is not None and cap * len(active) <= budget:
        for i in active:
            rates[i] = cap
        return rates
    capped: list[int] = []
    while True:
        free = [i for i in active if i not in set(capped)]
        solved = _algorithm_2(utilities, change_rates, free, budget - len(capped) * (cap or 0.0))
        over = [i for i, rate in solved.items() if cap is not None and rate > cap]
        if not over:
            break
        capped += over
    for i, rate in solved.items():
        rates[i] = rate
    for i in capped:
        rates[i] = cap or 0.0
    return rates


def _algorithm_2(
    utilities: Sequence[float], change_rates: Sequence[float], pages: list[int], budget: float
) -> dict[int, float]:
    """Azar et al.'s Algorithm 2 over ``pages`` (each with μ > 0 and Δ > 0): their rates, summing to ``budget``."""
    active = sorted(pages, key=lambda i: utilities[i] / change_rates[i])
    roots = sum(math.sqrt(utilities[i] * change_rates[i]) for i in active)
    deltas = sum(change_rates[i] for i in active)
    first = 0
    # Drop the page with the lowest μ/Δ while its rate would be ≤ 0 (Corollary 3); the last one always stays.
    while True:
        multiplier = (roots / (budget + deltas)) ** 2
        lowest = active[first]
        if first == len(active) - 1 or utilities[lowest] / change_rates[lowest] > multiplier:
            break
        roots -= math.sqrt(utilities[lowest] * change_rates[lowest])
        deltas -= change_rates[lowest]
        first += 1
    return {
        i: max(0.0, math.sqrt(utilities[i] * change_rates[i] / multiplier) - change_rates[i]) for i in active[first:]
    }


def freshness(utilities: Sequence[float], change_rates: Sequence[float], rates: Sequence[float]) -> float:
    """The demand-weighted share of fresh answers when page i is re-fetched at random at rate ρ_i (Problem 2's F)."""
    total = sum(utilities)
    fresh = 0.0
    for mu, delta, rate in zip(utilities, change_rates, rates, strict=True):
        fresh += mu if delta == 0 else (mu * rate / (rate + delta) if rate > 0 else 0.0)
    return fresh / total if total else 1.0


def edf_schedule(
    shares: Sequence[float], steps: int, credits: Sequence[float] | None = None
) -> tuple[list[int | None], list[float]]:
    """Which page to fetch at each of ``steps`` steps (Azar et al., Algorithm 3), and each page's credit after.

    ``shares`` are the pages' fetches per step (rates divided by the budget: they sum to at most 1).
    Every step adds each page's share to its credit; among pages whose credit is positive, the one whose
    credit reaches 1 first is fetched and its credit drops by 1. ``credits`` carries the credits of an
    earlier schedule over, so windows continue one schedule. A step with no page due is None.
    """
    count = len(shares)
    start = list(credits) if credits is not None else [0.0] * count
    fetched = [0] * count
    # A page is due at step t once t > (fetched - credit) / share; its deadline is (fetched + 1 - credit) / share.
    waiting = [((fetched[k] - start[k]) / shares[k], k) for k in range(count) if shares[k] > 0]
    heapq.heapify(waiting)
    due: list[tuple[float, int]] = []
    order: list[int | None] = []
    for step in range(1, steps + 1):
        while waiting and waiting[0][0] < step:
            _, page = heapq.heappop(waiting)
            heapq.heappush(due, ((fetched[page] + 1 - start[page]) / shares[page], page))
        if not due:
            order.append(None)
            continue
        deadline, page = heapq.heappop(due)
        order.append(page)
        fetched[page] += 1
        heapq.heappush(waiting, (deadline, page))
    return order, [start[k] + steps * shares[k] - fetched[k] for k in range(count)]


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """The distinct pages one window re-fetches, in order, and the EDF steps they come from."""

    picked: list[int]
    order: list[int | None]

    def credits_after(self, shares: Sequence[float], credits: Sequence[float], fetched: int) -> list[float]:
        """Every page's credit once the first ``fetched`` picked pages are fetched (the steps of the rest wait for
        the next window). A page whose rate is 0 starts afresh, should it get one again."""
        steps = self.order.index(self.picked[fetched]) if fetched < len(self.picked) else len(self.order)
        after = [credit + steps * share if share > 0 else 0.0 for share, credit in zip(shares, credits, strict=True)]
        for page in self.order[:steps]:
            if page is not None:
                after[page] -= 1
        return after


def plan_window(shares: Sequence[float], slots: int, credits: Sequence[float]) -> WindowPlan:
    """The EDF schedule's next ``slots`` distinct pages, carrying on from ``credits``.

    A page whose rate is more than one a window comes up more than once in it, and is fetched once: the
    schedule runs on (up to eight windows' steps) until the window's slots hold distinct pages.
    """
    scheduled = sum(1 for share in shares if share > 0)
    steps = slots
    while True:
        order, _ = edf_schedule(shares, steps, credits)
        picked = list(dict.fromkeys(page for page in order if page is not None))
        if len(picked) >= min(slots, scheduled) or steps >= 8 * slots:
            break
        steps *= 2
    if len(picked) > slots:
        picked = picked[:slots]
        order = order[: order.index(picked[-1]) + 1]
    return WindowPlan(picked, order)


def change_rate(fetches: int, changes: int, observed_s: float) -> float:
    """A page's changes per second, from ``fetches`` re-fetches over ``observed_s`` seconds of which ``changes``
    found it changed (Cho and Garcia-Molina, "Estimating frequency of change", with one prior observation)."""
    seen = fetches + 1
    changed = min(changes, fetches) + 0.5
    interval = (observed_s + PRIOR_INTERVAL_S) / seen
    return -math.log((seen - changed + 0.5) / (seen + 0.5)) / interval
