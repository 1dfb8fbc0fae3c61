"""Measure the classifier on the public user-agent corpus: crawlers' recall, people's false positives, speed.

    .venv/bin/python scripts/measure_classifier.py [--cache DIR] [--list] [--json FILE]
        [--no-lgpl] [--crawlerdetect-site DIR] [--no-isbot] [--readme docs/benchmarks.md]

Reads tests/data/user_agents/corpus-people.tsv.gz and corpus-crawlers.tsv.gz (built by
scripts/build_ua_corpus.py) and, when the cache folder holds them, Matomo's LGPL parts
(matomo-people.tsv.gz, matomo-crawlers.tsv.gz), one line per distinct user agent. Each is
classified by:
  * ours:   crawlergate's classifier with the default rules (heuristic.toml + crawlers.toml);
  * paper:  Heuristic 1 of the paper alone (heuristic.toml), as tests/conftest.py's paper_classifier;
  * crawlerdetect: PyPI crawlerdetect, when importable (or found in --crawlerdetect-site);
  * isbot:  npm isbot through node, when node and npm are installed (npm pack into the cache).
It prints recall per crawler set, people's false positives per kind (count and percentage), and
our classifier's cold speed (distinct user agents per second, each classified once). --list prints
every person our classifier calls a crawler, grouped by the token and rule that made it one;
--readme rewrites the accuracy table of docs/benchmarks.md (between its measure_classifier markers).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from crawlergate.classify import Classifier  # noqa: E402
from crawlergate.config import ClassifySettings  # noqa: E402
from crawlergate.progress import Progress  # noqa: E402

DATA = ROOT / "tests" / "data" / "user_agents"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "crawlergate" / "ua-corpus"
PEOPLE_KINDS = ("desktop", "mobile", "tablet", "in-app", "tv-console", "app", "other")
CRAWLER_SETS = ("search-engine", "ai-crawler", "other")
ISBOT_VERSION = "5.2.3"


@dataclass(frozen=True, slots=True)
class Row:
    label: str  # the kind of a person, the set of a crawler
    source: str
    ua: str
    shipped: bool


def read_tsv(path: Path, shipped: bool) -> list[Row]:
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t", 2)
            if len(parts) == 3 and parts[2]:
                rows.append(Row(parts[0], parts[1], parts[2], shipped))
    return rows


def load(cache: Path, use_lgpl: bool) -> tuple[list[Row], list[Row], list[str]]:
    """People and crawlers, one row per distinct user agent (shipped rows first)."""
    notes = []
    people = read_tsv(DATA / "corpus-people.tsv.gz", True)
    crawlers = read_tsv(DATA / "corpus-crawlers.tsv.gz", True)
    extra_people = cache / "matomo-people.tsv.gz"
    extra_crawlers = cache / "matomo-crawlers.tsv.gz"
    if use_lgpl and extra_people.exists() and extra_crawlers.exists():
        people += read_tsv(extra_people, False)
        crawlers += read_tsv(extra_crawlers, False)
        notes.append(f"with Matomo's LGPL fixtures from {cache}")
    else:
        notes.append("shipped corpus only (no Matomo LGPL cache: run scripts/build_ua_corpus.py)")
    crawler_uas = {row.ua for row in crawlers}
    seen: set[str] = set()
    unique_people = []
    for row in people:
        if row.ua not in seen and row.ua not in crawler_uas:
            seen.add(row.ua)
            unique_people.append(row)
    seen = set()
    unique_crawlers = []
    for row in crawlers:
        if row.ua not in seen:
            seen.add(row.ua)
            unique_crawlers.append(row)
    return unique_people, unique_crawlers, notes


# --- progress --------------------------------------------------------------------------------------


def run_each(label: str, uas: list[str], judge: Callable[[str], bool]) -> list[bool]:
    out = []
    with Progress(label, len(uas), unit=" user agents") as progress:
        for index, ua in enumerate(uas):
            out.append(bool(judge(ua)))
            if index % 256 == 255:
                progress.update(index + 1)
    return out


# --- comparison classifiers ------------------------------------------------------------------------


def crawlerdetect_judge(site: str | None) -> tuple[Callable[[str], bool] | None, str]:
    if site:
        sys.path.append(site)
    try:
        from crawlerdetect import CrawlerDetect  # type: ignore[import-not-found]
    except ImportError:
        return None, "crawlerdetect not installed (pip install crawlerdetect, or --crawlerdetect-site DIR)"
    try:
        from importlib.metadata import version

        name = f"crawlerdetect {version('crawlerdetect')}"
    except Exception:  # noqa: BLE001 - a version is only for the report
        name = "crawlerdetect"
    detector = CrawlerDetect()
    return (lambda ua: detector.isCrawler(ua)), name


ISBOT_RUNNER = """
const { isbot } = require(process.argv[2]);
const lines = require('fs').readFileSync(0, 'utf8').split('\\n');
if (lines.length && lines[lines.length - 1] === '') lines.pop();
process.stdout.write(lines.map((ua) => (isbot(ua) ? '1' : '0')).join(''));
"""


def isbot_verdicts(uas: list[str], cache: Path) -> tuple[list[bool] | None, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return None, "isbot skipped: node or npm not installed"
    folder = cache / f"isbot-{ISBOT_VERSION}"
    module = folder / "package" / "index.js"
    if not module.exists():
        (cache / "npm").mkdir(parents=True, exist_ok=True)
        tgz = cache / "npm" / f"isbot-{ISBOT_VERSION}.tgz"
        if not tgz.exists():
            done = subprocess.run(
                [npm, "pack", f"isbot@{ISBOT_VERSION}", "--silent", "--pack-destination", str(tgz.parent)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0 or not tgz.exists():
                return None, f"isbot skipped: npm pack failed: {done.stderr.strip()[:200]}"
        with tarfile.open(tgz) as archive:
            archive.extractall(folder, filter="data")
    runner = folder / "run.cjs"
    runner.write_text(ISBOT_RUNNER)
    started = time.monotonic()
    print(f"isbot {ISBOT_VERSION} (node): {len(uas):,} user agents ...", file=sys.stderr, flush=True)
    done = subprocess.run(
        [node, str(runner), str(module)], input="\n".join(uas) + "\n", capture_output=True, text=True, encoding="utf-8"
    )
    if done.returncode != 0 or len(done.stdout) != len(uas):
        return None, f"isbot failed: {done.stderr.strip()[:200]}"
    print(f"isbot: done in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return [c == "1" for c in done.stdout], f"isbot {ISBOT_VERSION}"


# --- why our classifier called it a crawler ---------------------------------------------------------


def pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "-"


def figures(rows: list[Row], verdicts: dict[str, list[bool]], groups: Iterable[str]) -> dict:
    out: dict[str, dict] = {}
    for name, flags in verdicts.items():
        per: dict[str, dict[str, int]] = {}
        for group in list(groups) + ["all"]:
            chosen = [flag for row, flag in zip(rows, flags, strict=True) if group in ("all", row.label)]
            per[group] = {"flagged": sum(chosen), "total": len(chosen)}
        out[name] = per
    return out


def table(title: str, stats: dict, groups: Iterable[str], what: str) -> str:
    names = list(stats)
    groups = list(groups) + ["all"]
    width = max(12, *(len(g) for g in groups))
    lines = [title, f"  {'':{width}} {'n':>8}  " + "  ".join(f"{n:>22}" for n in names)]
    for group in groups:
        total = next(iter(stats.values()))[group]["total"] if stats else 0
        cells = []
        for name in names:
            flagged = stats[name][group]["flagged"]
            shown = flagged if what == "flagged" else flagged
            cells.append(f"{shown:>9,} {pct(shown, total):>12}")
        lines.append(f"  {group:{width}} {total:>8,}  " + "  ".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


README_BEGIN = "<!-- measure_classifier:begin -->"
README_END = "<!-- measure_classifier:end -->"


def readme_table(recall: dict, false_positives: dict, corpus: str) -> str:
    """The accuracy table of the README: recall per crawler set, people's false positives per kind, every
    classifier measured in this run side by side."""
    names = list(recall)
    lines = [
        f"| | n | {' | '.join(names)} |",
        "|---|---|" + "---|" * len(names),
    ]
    for title, stats, groups in (
        ("crawlers recognised", recall, CRAWLER_SETS),
        ("people taken for crawlers", false_positives, PEOPLE_KINDS),
    ):
        for group in (*groups, "all"):
            total = stats[names[0]][group]["total"]
            cells = [
                f"{stats[name][group]['flagged']:,} ({pct(stats[name][group]['flagged'], total)})" for name in names
            ]
            lines.append(f"| {title}: {group} | {total:,} | {' | '.join(cells)} |")
    lines.append("")
    lines.append(f"Written by `python scripts/measure_classifier.py --readme docs/benchmarks.md` ({corpus}).")
    return "\n".join(lines)


def write_readme_table(path: Path, recall: dict, false_positives: dict, corpus: str) -> None:
    text = path.read_text(encoding="utf-8")
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(f"{path} has no {README_BEGIN} ... {README_END} block to rewrite")
    table_text = readme_table(recall, false_positives, corpus)
    path.write_text(text[: start + len(README_BEGIN)] + "\n" + table_text + "\n" + text[end:], encoding="utf-8")
    print(f"wrote the accuracy table into {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help=f"build cache with the LGPL parts ({DEFAULT_CACHE})"
    )
    parser.add_argument("--no-lgpl", action="store_true", help="measure the shipped corpus only")
    parser.add_argument("--list", action="store_true", help="list every person our classifier calls a crawler")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--crawlerdetect-site", help="a site-packages folder holding crawlerdetect")
    parser.add_argument("--no-crawlerdetect", action="store_true")
    parser.add_argument("--no-isbot", action="store_true")
    parser.add_argument(
        "--readme",
        type=Path,
        metavar="FILE",
        help="rewrite the accuracy table between the measure_classifier markers of FILE (docs/benchmarks.md)",
    )
    parser.add_argument(
        "--write-known",
        type=Path,
        metavar="FILE",
        help="write the shipped corpus's people our classifier calls crawlers, with why (tests/test_corpus.py)",
    )
    args = parser.parse_args(argv)

    people, crawlers, notes = load(args.cache, not args.no_lgpl)
    people_uas = [row.ua for row in people]
    crawler_uas = [row.ua for row in crawlers]
    everything = people_uas + crawler_uas
    print(
        f"corpus: {len(people):,} people ({sum(r.shipped for r in people):,} shipped), {len(crawlers):,} crawlers "
        f"({sum(r.shipped for r in crawlers):,} shipped); {'; '.join(notes)}",
        file=sys.stderr,
    )

    ours = Classifier.from_settings(ClassifySettings())
    ours = Classifier(ours.ruleset, memo_size=len(everything) + 1)  # room for every distinct user agent
    started = time.perf_counter()
    our_all = [ours.classify(ua).is_crawler for ua in everything]
    ours_seconds = time.perf_counter() - started
    paper = Classifier.from_settings(ClassifySettings(rule_files=("heuristic.toml",)))
    paper = Classifier(paper.ruleset, memo_size=len(everything) + 1)
    started = time.perf_counter()
    paper_all = [paper.classify(ua).is_crawler for ua in everything]
    paper_seconds = time.perf_counter() - started

    verdicts_all: dict[str, list[bool]] = {"ours": our_all, "paper": paper_all}
    skipped = []
    if not args.no_crawlerdetect:
        judge, name = crawlerdetect_judge(args.crawlerdetect_site)
        if judge is None:
            skipped.append(name)
        else:
            verdicts_all[name] = run_each(name, everything, judge)
    if not args.no_isbot:
        flags, name = isbot_verdicts(everything, args.cache)
        if flags is None:
            skipped.append(name)
        else:
            verdicts_all[name] = flags

    n_people = len(people)
    people_verdicts = {name: flags[:n_people] for name, flags in verdicts_all.items()}
    crawler_verdicts = {name: flags[n_people:] for name, flags in verdicts_all.items()}
    recall = figures(crawlers, crawler_verdicts, CRAWLER_SETS)
    false_positives = figures(people, people_verdicts, PEOPLE_KINDS)
    shipped_people = [row for row in people if row.shipped]
    shipped_fp = figures(
        shipped_people,
        {n: [f for r, f in zip(people, v, strict=True) if r.shipped] for n, v in people_verdicts.items()},
        PEOPLE_KINDS,
    )
    speed = {
        "ours": {"distinct": len(everything), "seconds": ours_seconds, "per_second": len(everything) / ours_seconds},
        "paper": {"distinct": len(everything), "seconds": paper_seconds, "per_second": len(everything) / paper_seconds},
    }

    print("; ".join(notes))
    if skipped:
        print("skipped: " + "; ".join(skipped))
    print()
    print(table("Crawlers recognised (recall), per set:", recall, CRAWLER_SETS, "flagged"))
    print()
    print(table("People called crawlers (false positives), per kind:", false_positives, PEOPLE_KINDS, "flagged"))
    if len(shipped_people) != len(people):
        print()
        print(table("  ... of which in the shipped corpus only:", shipped_fp, PEOPLE_KINDS, "flagged"))
    print()
    for name, figure in speed.items():
        print(
            f"Speed, {name}: {figure['distinct']:,} distinct user agents, cold (each classified once, memo empty): "
            f"{figure['seconds']:.2f} s = {figure['per_second']:,.0f} per second"
        )

    if args.readme:
        included = "Matomo's fixtures included" if len(shipped_people) != len(people) else "the shipped corpus"
        corpus = f"{len(people):,} people, {len(crawlers):,} crawlers, {included}, {time.strftime('%Y-%m-%d')}"
        write_readme_table(args.readme, recall, false_positives, corpus)

    listing = []
    if args.list or args.json:
        groups: dict[str, list[Row]] = defaultdict(list)
        for row, flag in zip(people, people_verdicts["ours"], strict=True):
            if flag:
                verdict, reason = ours.explain(row.ua)
                groups[f"{reason} -> family {verdict.family} ({verdict.tag})"].append(row)
        for reason in sorted(groups, key=lambda r: (-len(groups[r]), r)):
            listing.append(
                {
                    "rule": reason,
                    "people": [
                        {"kind": r.label, "source": r.source, "ua": r.ua, "shipped": r.shipped}
                        for r in sorted(groups[reason], key=lambda r: (r.label, r.ua))
                    ],
                }
            )
        if args.list:
            total = sum(len(v) for v in groups.values())
            print()
            print(f"People our classifier calls crawlers: {total} in {len(groups)} groups (by the token that decided)")
            for entry in listing:
                print()
                print(f"== {entry['rule']}: {len(entry['people'])}")
                for person in entry["people"]:
                    mark = "" if person["shipped"] else " [LGPL cache]"
                    print(f"   {person['kind']}\t{person['source']}{mark}\t{person['ua']}")

    if args.write_known:
        known = sorted(
            (row.label, ours.explain(row.ua)[1], row.ua)
            for row, flag in zip(people, people_verdicts["ours"], strict=True)
            if flag and row.shipped
        )
        header = (
            "# People of the shipped corpus our classifier still calls crawlers, and why (the token, the rule file).\n"
            "# Columns: kind<TAB>reason<TAB>user agent. Written by scripts/measure_classifier.py --write-known;\n"
            "# tests/test_corpus.py fails when a person joins or leaves this list.\n"
        )
        args.write_known.write_text(header + "".join(f"{kind}\t{why}\t{ua}\n" for kind, why, ua in known))
        print(f"wrote {len(known)} known false positives to {args.write_known}", file=sys.stderr)

    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "corpus": {
                        "people": len(people),
                        "people_shipped": len(shipped_people),
                        "crawlers": len(crawlers),
                        "crawlers_shipped": sum(r.shipped for r in crawlers),
                        "notes": notes,
                        "skipped": skipped,
                    },
                    "recall": recall,
                    "false_positives": false_positives,
                    "false_positives_shipped": shipped_fp,
                    "speed": speed,
                    "flagged_people": listing,
                },
                indent=1,
                ensure_ascii=False,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
