"""The classifier on the public corpus of real user agents (tests/data/user_agents, built by
scripts/build_ua_corpus.py from packages that are not ours): crawlers' recall per set, and people taken for
crawlers, each known by name and reason, so a rule change that takes one more person for a crawler fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from crawlergate.classify import Classifier
from crawlergate.config import Settings
from tests.conftest import read_corpus

CORPUS = Path(__file__).parent / "data" / "user_agents"
KNOWN = CORPUS / "known-false-positives.tsv"
# A current browser's own string (Chrome, Safari, Edge, Opera, Samsung Internet, Firefox), whatever its system part.
BROWSER_GRAMMAR = re.compile(
    r"Mozilla/5\.0 \([^()]*(?:\([^()]*\)[^()]*)?\) (?:AppleWebKit/[\d.]+ \(KHTML, like Gecko\)(?: Version/[\d.]+)?"
    r"(?: Chrome/[\d.]+)?(?: Mobile(?:/\w+)?)? Safari/[\d.]+"
    r"(?: Edg(?:A|iOS)?/[\d.]+| OPR/[\d.]+| SamsungBrowser/[\d.]+)?"
    r"|Gecko/\d+ Firefox/[\d.]+)"
)
# Issue 27's goals for the shipped corpus: six figures of distinct people, and at most one in 25,000 of them taken for
# a crawler.
LEAST_PEOPLE = 100_000
MOST_PEOPLE_TAKEN_FOR_CRAWLERS = 1 / 25_000
# Recall on each crawler set of the shipped corpus today (568/568, 135/136, 2,382/2,401), not to be lowered
# (issue 27 asks search engines 99.5 % and AI crawlers 98 % at least).
LEAST_RECALL = {"search-engine": 1.0, "ai-crawler": 135 / 136, "other": 2382 / 2401}


@pytest.fixture(scope="module")
def classifier() -> Classifier:
    return Classifier.from_settings(Settings().classify)


def test_people_taken_for_crawlers_are_only_the_known_ones(classifier: Classifier) -> None:
    known = {line.split("\t", 2)[2] for line in KNOWN.read_text().splitlines() if not line.startswith("#")}
    flagged = {ua: kind for kind, ua in read_corpus("corpus-people.tsv.gz") if classifier.classify(ua).is_crawler}
    joined = sorted(set(flagged) - known)
    left = sorted(known - set(flagged))
    explained = "\n".join(f"  {flagged[ua]}\t{classifier.explain(ua)[1]}\t{ua}" for ua in joined)
    assert not joined, f"{len(joined)} more people taken for crawlers:\n{explained}"
    assert not left, (
        f"{len(left)} people no longer taken for crawlers: rewrite {KNOWN.name} "
        "(scripts/measure_classifier.py --no-lgpl --write-known tests/data/user_agents/known-false-positives.tsv)"
    )


@pytest.mark.xfail(reason="issue 27: the public sources give 96,904 distinct people so far", strict=True)
def test_the_corpus_holds_six_figures_of_people() -> None:
    assert len(read_corpus("corpus-people.tsv.gz")) >= LEAST_PEOPLE


def test_at_most_one_person_in_25000_is_taken_for_a_crawler(classifier: Classifier) -> None:
    people = [ua for _, ua in read_corpus("corpus-people.tsv.gz")]
    flagged = sum(classifier.classify(ua).is_crawler for ua in people)
    assert flagged <= len(people) * MOST_PEOPLE_TAKEN_FOR_CRAWLERS, f"{flagged} of {len(people):,}"


def test_no_current_browser_is_taken_for_a_crawler(classifier: Classifier) -> None:
    """Not even the Android phone whose locale field holds "http/1.0 500 died" (a field blanked since)."""
    browsers = [ua for _, ua in read_corpus("corpus-people.tsv.gz") if BROWSER_GRAMMAR.fullmatch(ua)]
    flagged = [ua for ua in browsers if classifier.classify(ua).is_crawler]
    assert len(browsers) > 15_000
    assert flagged == []


def test_crawlers_are_recognised_on_every_set(classifier: Classifier) -> None:
    by_set: dict[str, list[bool]] = {}
    for crawler_set, ua in read_corpus("corpus-crawlers.tsv.gz"):
        by_set.setdefault(crawler_set, []).append(classifier.classify(ua).is_crawler)
    recall = {name: sum(flags) / len(flags) for name, flags in by_set.items()}
    assert all(recall[name] >= least for name, least in LEAST_RECALL.items()), recall


def test_the_readme_table_is_written_by_the_measuring_script(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("before\n<!-- measure_classifier:begin -->\nold\n<!-- measure_classifier:end -->\nafter\n")
    script = Path(__file__).resolve().parent.parent / "scripts" / "measure_classifier.py"
    argv = [sys.executable, str(script), "--no-lgpl", "--no-isbot", "--no-crawlerdetect", "--readme", str(readme)]
    subprocess.run(argv, check=True, capture_output=True, timeout=300)
    text = readme.read_text()
    assert text.startswith("before\n<!-- measure_classifier:begin -->\n| | n | ours | paper |") and "old" not in text
    assert "| people taken for crawlers: all | 96,904 |" in text and text.endswith("end -->\nafter\n")
