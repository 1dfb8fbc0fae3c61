"""Revalidation without change signals: Azar et al.'s optimal rates + EDF against refreshing uniformly.

A simulated site: `--pages` pages whose crawler demand follows Zipf's law and whose content changes
at random (Poisson) at rates drawn log-normally, independent of demand. Each day one window re-fetches
`--budget` pages. Three policies share that budget:

- uniform:       every page in turn (round robin), the policy of a site with no priorities;
- azar (known):  the optimal rates from the true change rates, turned into fetches by the EDF schedule;
- azar (learnt): the same from change rates estimated by what its own re-fetches found (crawlergate's
                 regenerator: `change_rate` over each page's history, starting from the prior).

The figure is the demand-weighted freshness: the share of crawler requests that get the page as it is
now, averaged over the days after a burn-in (the exact expectation given each policy's fetch days).

    python scripts/bench_revalidation.py [--pages 2000 --budget 200 --days 60 --seed 7]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable

from crawlergate.regenerate.rates import change_rate, optimal_rates, plan_window

DAY_S = 86400.0
Chooser = Callable[[int, list[float]], list[int]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--budget", type=int, default=200, help="re-fetches a day (one window a day)")
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--burn-in", type=int, default=14, help="days not counted while the policies settle")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    generator = random.Random(args.seed)
    demand = [1.0 / rank for rank in range(1, args.pages + 1)]  # Zipf, s = 1
    changes = [generator.lognormvariate(math.log(0.1), 1.5) for _ in range(args.pages)]  # median once in 10 days
    generator.shuffle(changes)

    results = {
        "uniform": simulate(args, demand, changes, _uniform(args.pages, args.budget)),
        "azar (known rates)": simulate(args, demand, changes, _azar_known(demand, changes, args.budget)),
        "azar (learnt rates)": simulate(args, demand, changes, _azar_learnt(demand, changes, args.budget)),
    }
    print(f"{args.pages:,} pages, {args.budget:,} re-fetches a day, {args.days} days ({args.burn_in} burn-in)")
    for name, value in results.items():
        print(f"  {name:<22} demand-weighted freshness {value:.4f}")
    uniform = results["uniform"]
    for name in ("azar (known rates)", "azar (learnt rates)"):
        print(f"  {name} / uniform: {results[name] / uniform:.3f}")
    return 0


class _Observations:
    """What a policy's own re-fetches saw: fetches, changes found, time covered, per page."""

    def __init__(self, pages: int) -> None:
        self.fetches = [0] * pages
        self.changes = [0] * pages
        self.observed_days = [0.0] * pages


def simulate(args: argparse.Namespace, demand: list[float], changes: list[float], choose: Chooser) -> float:
    """Demand-weighted expected freshness over the counted days when ``choose(day, ages)`` picks each day's fetches."""
    ages = [0.0] * args.pages  # days since each page was last fetched, at the start of the day
    total_demand = sum(demand)
    fresh = 0.0
    for day in range(args.days):
        for page in choose(day, ages):
            ages[page] = 0.0
        if day >= args.burn_in:
            for page in range(args.pages):
                rate = changes[page]
                # The day's mean of P(no change since the fetch) = e^(-Δ a0) (1 - e^-Δ) / Δ.
                fresh += demand[page] * math.exp(-rate * ages[page]) * (1 - math.exp(-rate)) / rate
        ages = [age + 1.0 for age in ages]
    return fresh / total_demand / (args.days - args.burn_in)


def _uniform(pages: int, budget: int) -> Chooser:
    def choose(day: int, ages: list[float]) -> list[int]:
        return [(day * budget + offset) % pages for offset in range(budget)]

    return choose


def _azar_known(demand: list[float], changes: list[float], budget: int) -> Chooser:
    shares = [rate / budget for rate in optimal_rates(demand, changes, float(budget), cap=1.0)]
    credits = [0.0] * len(demand)

    def choose(day: int, ages: list[float]) -> list[int]:
        nonlocal credits
        plan = plan_window(shares, budget, credits)
        credits = plan.credits_after(shares, credits, len(plan.picked))
        return plan.picked

    return choose


def _azar_learnt(demand: list[float], true_changes: list[float], budget: int) -> Chooser:
    """As the regenerator does it: the site's changes are known only by what its own re-fetches found."""
    seen = _Observations(len(demand))
    credits = [0.0] * len(demand)
    generator = random.Random(1)

    def choose(day: int, ages: list[float]) -> list[int]:
        nonlocal credits
        estimates = [
            change_rate(seen.fetches[page], seen.changes[page], seen.observed_days[page] * DAY_S) * DAY_S
            for page in range(len(demand))
        ]
        shares = [rate / budget for rate in optimal_rates(demand, estimates, float(budget), cap=1.0)]
        plan = plan_window(shares, budget, credits)
        credits = plan.credits_after(shares, credits, len(plan.picked))
        for page in plan.picked:
            interval = ages[page]
            seen.fetches[page] += 1
            seen.observed_days[page] += interval
            seen.changes[page] += generator.random() < 1 - math.exp(-true_changes[page] * interval)
        return plan.picked

    return choose


if __name__ == "__main__":
    sys.exit(main())
