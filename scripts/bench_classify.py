"""Classifications per second on a realistic stream of user agents, memoised and cold.

A real log repeats user agents: a few browsers and crawlers send most requests (a Zipf-like
tail). The stream here draws from a pool of distinct user agents built from the test data with
varied version numbers, so "cold" (every user agent new) and "memoised" (the log's repeats) are
both measured on the same strings, in one run, beside the paper's heuristic alone.

    python scripts/bench_classify.py [--distinct 100000] [--stream 1000000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from crawlergate.classify import Classifier
from crawlergate.config import ClassifySettings

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "user_agents"


def distinct_user_agents(count: int, rng: random.Random) -> list[str]:
    """`count` distinct user agents: the test data's humans (90 %) and crawlers, with version numbers varied."""
    humans = _lines("humans.txt")
    crawlers = [line.split("\t", 1)[1] for line in _lines("crawlers.txt")]
    pool: set[str] = set()
    while len(pool) < count:
        template = rng.choice(humans) if rng.random() < 0.9 else rng.choice(crawlers)
        pool.add(template.replace("537.36", f"537.{rng.randrange(10_000)}").replace("1.0", f"1.{rng.randrange(999)}"))
    return sorted(pool)


def zipf_stream(pool: list[str], length: int, rng: random.Random, exponent: float = 1.1) -> list[str]:
    weights = [1 / (rank**exponent) for rank in range(1, len(pool) + 1)]
    return rng.choices(pool, weights=weights, k=length)


def rate(classifier: Classifier, user_agents: list[str]) -> float:
    classify = classifier.classify
    started = time.perf_counter()
    for user_agent in user_agents:
        classify(user_agent)
    return len(user_agents) / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distinct", type=int, default=100_000)
    parser.add_argument("--stream", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(2012)
    pool = distinct_user_agents(args.distinct, rng)
    stream = zipf_stream(pool, args.stream, rng)
    print(f"{len(pool):,} distinct user agents; a stream of {len(stream):,} with {len(set(stream)):,} distinct")

    results: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        for name, rule_files in (
            ("crawlergate rules", ("heuristic.toml", "crawlers.toml")),
            ("paper heuristic", ("heuristic.toml",)),
        ):
            cold = Classifier.from_settings(ClassifySettings(rule_files=rule_files, memo_size=0))
            results.setdefault(f"{name}, cold (every UA new)", []).append(rate(cold, pool))
            memo = Classifier.from_settings(ClassifySettings(rule_files=rule_files))
            results.setdefault(f"{name}, memoised log stream", []).append(rate(memo, stream))
        print(f"  run {repeat + 1}/{args.repeats} done", file=sys.stderr)

    print(f"\n{'case':<46}{'median/s':>14}{'min/s':>14}")
    for case, rates in results.items():
        print(f"{case:<46}{statistics.median(rates):>14,.0f}{min(rates):>14,.0f}")
    return 0


def _lines(name: str) -> list[str]:
    return [line for line in (DATA / name).read_text().splitlines() if line and not line.startswith("#")]


if __name__ == "__main__":
    raise SystemExit(main())
