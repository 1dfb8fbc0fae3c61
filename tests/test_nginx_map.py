"""The nginx include's crawler map against the classifier, on the public corpus of user agents: nginx may call
a user agent an announced crawler only where the classifier does, and it should find most of them."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from crawlergate.classify import Classifier
from crawlergate.config import ClassifySettings, Settings
from crawlergate.front.nginx import count_user_agents, crawler_map, known_agents, served_families
from crawlergate.stores.published import PLAIN_PATH, published_name, target_of
from tests.conftest import read_corpus
from tests.visitors import BINGBOT_UA, FIREFOX_UA, GOOGLEBOT_UA


@pytest.fixture(scope="module")
def classifier() -> Classifier:
    return Classifier.from_settings(Settings().classify)


def test_the_map_never_calls_a_person_a_crawler_where_the_classifier_does_not(classifier: Classifier) -> None:
    crawlers = crawler_map(classifier.ruleset, served_families(Settings(), classifier))
    disagreements = [
        user_agent
        for _, user_agent in read_corpus("corpus-people.tsv.gz") + read_corpus("corpus-crawlers.tsv.gz")
        if crawlers.says_crawler(user_agent) and not classifier.classify(user_agent).is_crawler
    ]
    assert disagreements == []


def test_the_map_finds_the_announced_search_engines_and_ai_crawlers(classifier: Classifier) -> None:
    crawlers = crawler_map(classifier.ruleset, served_families(Settings(), classifier))
    for crawler_set, least in (("search-engine", 0.85), ("ai-crawler", 0.85)):
        named = [ua for kind, ua in read_corpus("corpus-crawlers.tsv.gz") if kind == crawler_set]
        named = [ua for ua in named if classifier.classify(ua).family not in ("", "unknown")]
        found = sum(crawlers.says_crawler(ua) for ua in named)
        assert found / len(named) >= least, (crawler_set, found, len(named))


def test_known_agents_are_the_crawlers_seen_most_each_once_and_quotable(classifier: Classifier) -> None:
    crawlers = crawler_map(classifier.ruleset, served_families(Settings(), classifier))
    counts = Counter({
        FIREFOX_UA: 900,  # a person: the patterns decide, and say no
        "curl/8.5.0": 500,  # a program: no family the policy serves from the cache
        BINGBOT_UA: 40,
        GOOGLEBOT_UA: 300,
        GOOGLEBOT_UA.upper(): 200,  # nginx matches keys case-insensitively: the same key
        'Googlebot/2.1 "quoted"': 100,  # cannot be an nginx quoted string
        "Googlebot/2.1 $x": 100,
        "~Googlebot/2.1": 100,  # would be read as a pattern
        "Googlebot/2.1 \u00e9t\u00e9": 100,
        "Googlebot/2.1 " + "x" * 400: 100,  # longer than a bucket is made for
    })  # fmt: skip
    assert known_agents(crawlers, counts) == [GOOGLEBOT_UA, BINGBOT_UA]
    assert known_agents(crawlers, counts, limit=1) == [GOOGLEBOT_UA]


def test_counting_a_log_of_ever_new_user_agents_keeps_the_frequent_ones_exactly_within_the_limit() -> None:
    """A bot that sends a new user agent with every request (and people's long tail) must not take the memory of
    nginx-config --agents-from: past the limit the rarest are dropped, never one that could be learned."""
    frequent = [GOOGLEBOT_UA, BINGBOT_UA, FIREFOX_UA]
    seen = [frequent[n % 3] if n % 4 == 0 else f"scraper{n}/1.0" for n in range(120_000)]  # two chunks
    counts = count_user_agents(seen, limit=1_000)
    assert len(counts) <= 1_000
    assert {agent: counts[agent] for agent in frequent} == {agent: 10_000 for agent in frequent}
    assert count_user_agents([GOOGLEBOT_UA], counts)[GOOGLEBOT_UA] == 10_001  # added to what was counted


def test_nginx_config_learns_known_agents_from_a_log_and_refuses_one_without_user_agents(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    lines = [f'192.0.2.1 - - [27/Nov/2026:10:00:00 +0000] "GET /t/{n} HTTP/1.1" 200 5 "-" "{ua}"\n'
             for n, ua in enumerate([GOOGLEBOT_UA] * 3 + [FIREFOX_UA] * 5 + [BINGBOT_UA])]  # fmt: skip
    log.write_text("".join(lines))
    command = [sys.executable, "-m", "crawlergate", "nginx-config", "--origin", "http://127.0.0.1:1"]
    made = subprocess.run([*command, "--out", str(tmp_path / "inc"), "--agents-from", str(log)], capture_output=True)
    assert made.returncode == 0, made.stderr
    assert b"crawler user agents found by a hash lookup: 2" in made.stderr
    include = (tmp_path / "inc" / "crawlergate-http.conf").read_text()
    assert f'    "{GOOGLEBOT_UA}" 1;\n    "{BINGBOT_UA}" 1;\n' in include and FIREFOX_UA not in include
    assert "map_hash_bucket_size 256;" in (tmp_path / "inc" / "crawlergate-hash.conf").read_text()
    bare = tmp_path / "bare.log"
    bare.write_text('192.0.2.1 - - [27/Nov/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 5\n')
    refused = subprocess.run([*command, "--out", str(tmp_path / "x"), "--agents-from", str(bare)], capture_output=True)
    assert refused.returncode != 0 and b"records no user agents" in refused.stderr
    assert b"Traceback" not in refused.stderr and not (tmp_path / "x").exists()
    # A layout the tools do not detect: refused with the hint to give --format, which reads it.
    odd = tmp_path / "odd.log"
    odd.write_text(f'192.0.2.1 [27/Nov/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 "{GOOGLEBOT_UA}" 0.004\n')
    undetected = subprocess.run(
        [*command, "--out", str(tmp_path / "y"), "--agents-from", str(odd)], capture_output=True
    )
    assert (
        undetected.returncode != 0 and b"give --format" in undetected.stderr and b"Traceback" not in undetected.stderr
    )
    layout = '$remote_addr [$time_local] "$request" $status "$http_user_agent" $request_time'
    given = subprocess.run([*command, "--out", str(tmp_path / "y"), "--agents-from", str(odd), "--format", layout],
                           capture_output=True)  # fmt: skip
    assert given.returncode == 0 and b"found by a hash lookup: 1" in given.stderr, given.stderr
    # --format alone reads nothing; and what stops the command is said before any log is read.
    alone = subprocess.run([*command, "--out", str(tmp_path / "z"), "--format", layout], capture_output=True)
    assert alone.returncode != 0 and b"give one, or leave --format out" in alone.stderr
    siteless = [sys.executable, "-m", "crawlergate", "nginx-config", "--out", str(tmp_path / "z")]
    early = subprocess.run([*siteless, "--agents-from", str(log)], capture_output=True)
    assert early.returncode != 0 and b"needs the site" in early.stderr and b"read as" not in early.stderr
    assert not (tmp_path / "z").exists()


def _with_policy(tmp_path: Path, policy: str) -> Settings:
    rules = Path(__file__).parent.parent / "rules"
    for name in rules.iterdir():
        if name.is_file():
            (tmp_path / name.name).write_bytes(name.read_bytes())
    (tmp_path / "policy.toml").write_text(policy)
    return Settings(classify=ClassifySettings(rules_dir=str(tmp_path)))


def test_a_family_whose_claimants_must_be_verified_is_left_to_the_gate_when_claimants_are_not_cached(
    classifier: Classifier, tmp_path: Path
) -> None:
    settings = _with_policy(tmp_path, '[tag]\nunverified-claimant = "deny"\n')
    served = served_families(settings, classifier)
    assert "Googlebot" not in served and "Bingbot" not in served  # published ranges: nginx cannot check them
    assert "Anthropic" in served  # no ranges: the gate cannot verify it either
    assert "Googlebot" in served_families(Settings(), classifier)


def test_a_family_the_policy_denies_or_passes_is_left_to_the_gate(classifier: Classifier, tmp_path: Path) -> None:
    settings = _with_policy(tmp_path, '[class]\ncrawler = "cache"\n[family]\nGooglebot = "deny"\n')
    served = served_families(settings, classifier)
    assert "Googlebot" not in served and "Bingbot" in served
    crawlers = crawler_map(classifier.ruleset, served)
    assert not crawlers.says_crawler("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)")
    assert crawlers.says_crawler("Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)")


@pytest.mark.parametrize(
    ("target", "name"),
    [
        ("/", ".index.gz"),
        ("/topic/1", "topic/1.gz"),
        ("/forum/", "forum/.index.gz"),
        ("/a.gz", None),
        ("/a.gz.html", "a.gz.html.gz"),
        ("/topic/1?x=1", None),
        ("/topic/%2F", None),
        ("/.hidden", None),
        ("/a/../b", None),
        ("//double", None),
        ("/a;b", None),
        ("/" + "x" * 300, None),
    ],
)
def test_only_plain_paths_are_published_and_their_names_lead_back(target: str, name: str | None) -> None:
    assert published_name(target) == name
    if name is not None:
        assert target_of(name) == target
    assert PLAIN_PATH.startswith("^") and PLAIN_PATH.endswith("$")
