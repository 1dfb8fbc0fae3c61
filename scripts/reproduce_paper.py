"""The paper's experiment end to end at a chosen scale, written as a table beside the paper's numbers.

Koehl & Wang, "Surviving a Search Engine Overload" (WWW 2012): crawler and human response times
with and without the cache, throughput with and without it (the demo experiment: the forum alone
and behind `crawlergate serve`), and the L1 hit ratio of LRU against LRU with human-induced
prefetching at three sizes, with the clairvoyant and infinite bounds (`crawlergate simulate` on a
longer synthetic trace of the same forum).

    python scripts/reproduce_paper.py [--threads 1000] [--requests 1600] [--work-ms 20]
                                      [--sim-requests 300000] [--out paper.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from crawlergate.classify import Classifier
from crawlergate.config import Settings
from crawlergate.demo.run import DemoSpec, running_experiment
from crawlergate.demo.trace import TraceSpec, structure_of, write_trace
from crawlergate.keys import KeyMaker
from crawlergate.tools.simulate import parse_trace, simulate

PAPER = {
    "crawler_ms": (162.109, 1.367),
    "human_ms": (162.109, 111.722),
    "throughput": (117, 215),
    "lru": (54.76, 61.22, 68.67),
    "lru+human": (60.67, 67.93, 76.55),
    "perfect": 90.0,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=1600)
    parser.add_argument("--work-ms", type=float, default=20.0)
    parser.add_argument("--sim-requests", type=int, default=300_000)
    parser.add_argument("--out", type=Path, help="also write the table (Markdown) here")
    args = parser.parse_args()
    settings = Settings()
    spec = DemoSpec(threads=args.threads, requests=args.requests, work_ms=args.work_ms)
    with running_experiment(spec, settings, None) as experiment:
        direct, gated = (result.summary() for result in experiment.closed)
        slow, fast = (result.summary() for result in experiment.opened)
        folder = experiment.folder

    trace_path = folder / "simulation.log"
    structure = structure_of(folder / "forum.sqlite3")
    write_trace(trace_path, TraceSpec(requests=args.sim_requests, seed=spec.seed + 1), structure)
    keys = KeyMaker.from_settings(settings)
    trace = parse_trace(trace_path, Classifier.from_settings(settings.classify), keys)
    # The paper's 120/250/500 MB were about 10, 20 and 40 % of its pages; the same shares of ours.
    sizes = [int(trace.total_bytes * share) for share in (0.10, 0.20, 0.40)]
    ratios = {policy: [simulate(trace, policy, size).hit_ratio * 100 for size in sizes]
              for policy in ("lru", "lru+human", "min", "infinite")}  # fmt: skip

    rows = [
        ("crawler mean response, no cache → cache (ms)", _pair(PAPER["crawler_ms"]),
         f"{slow['crawler']['ttfb_ms']['mean']:.3f} → {fast['crawler']['ttfb_ms']['mean']:.3f}"),
        ("crawler speed-up", f"{PAPER['crawler_ms'][0] / PAPER['crawler_ms'][1]:.0f}×",
         f"{slow['crawler']['ttfb_ms']['mean'] / fast['crawler']['ttfb_ms']['mean']:.0f}×"),
        ("human mean response, no cache → cache (ms)", _pair(PAPER["human_ms"]),
         f"{slow['human']['ttfb_ms']['mean']:.3f} → {fast['human']['ttfb_ms']['mean']:.3f}"),
        ("human change", _signed(PAPER["human_ms"][1] / PAPER["human_ms"][0] - 1),
         _signed(fast["human"]["ttfb_ms"]["mean"] / slow["human"]["ttfb_ms"]["mean"] - 1)),
        ("throughput, no cache → cache (requests/s)", _pair(PAPER["throughput"]),
         f"{direct['throughput_rps']:.1f} → {gated['throughput_rps']:.1f}"),
        ("throughput gain", f"{PAPER['throughput'][1] / PAPER['throughput'][0]:.2f}×",
         f"{gated['throughput_rps'] / direct['throughput_rps']:.2f}×"),
    ]  # fmt: skip
    for index, label in enumerate(("small", "medium", "large")):
        size = f"{sizes[index] / 1e6:.0f} MB" if sizes[index] >= 1e6 else f"{sizes[index] / 1e3:.0f} KB"
        lru = f"{ratios['lru'][index]:.2f} % ({size})"
        rows.append((f"L1 hit ratio, LRU, {label} L1", f"{PAPER['lru'][index]:.2f} %", lru))
        rows.append((f"L1 hit ratio, LRU + human, {label} L1", f"{PAPER['lru+human'][index]:.2f} %",
                     f"{ratios['lru+human'][index]:.2f} % ({size})"))  # fmt: skip
        rows.append((f"clairvoyant (MIN), {label} L1", "", f"{ratios['min'][index]:.2f} %"))
    rows.append(("perfect cache (unlimited)", f"{PAPER['perfect']:.0f} %", f"{ratios['infinite'][0]:.2f} %"))

    header = "| measure | paper | crawlergate |\n|---|---|---|\n"
    table = header + "\n".join(f"| {name} | {paper} | {ours} |" for name, paper, ours in rows)
    print(table)
    if args.out:
        args.out.write_text(table + "\n", encoding="utf-8")
    return 0


def _signed(change: float) -> str:
    """A relative change with one sign: "−31 %", "+4 %" (never "−-21%")."""
    return f"{'−' if change < 0 else '+'}{abs(change):.0%}"


def _pair(values: tuple[float, float]) -> str:
    return f"{values[0]:g} → {values[1]:g}"


if __name__ == "__main__":
    raise SystemExit(main())
