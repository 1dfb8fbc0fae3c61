"""The evidence rules, the behaviour sketch, the published ranges, reverse DNS, the policy table and the valve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crawlergate.classify import Verdict
from crawlergate.config import ValveSettings, load_settings
from crawlergate.errors import ConfigError
from crawlergate.gate.valve import OverloadValve
from crawlergate.metrics import Metrics
from crawlergate.rules import default_rules_dir
from crawlergate.suspect.evidence import browser_claim, load_evidence_rules
from crawlergate.suspect.judge import PERSON, SUSPECT_BY_EVIDENCE, UNVERIFIED_CLAIMANT, Judge
from crawlergate.suspect.policy import Action, Policy, load_policy
from crawlergate.suspect.ranges import default_ranges_file, load_ranges, read_published
from crawlergate.suspect.rdns import ReverseDns
from crawlergate.suspect.sketch import BehaviourSketch, client_of, network_of
from tests.visitors import (
    CHROME_NAVIGATION,
    CHROME_UA,
    EDGE_UA,
    FIREFOX_NAVIGATION,
    FIREFOX_UA,
    IE11_UA,
    OLD_BROWSER_NAVIGATION,
    OLD_SAFARI_UA,
    SAFARI_UA,
    SCRIPTED,
)


@pytest.fixture(scope="module")
def rules():  # type: ignore[no-untyped-def]
    return load_evidence_rules(default_rules_dir() / "evidence.toml")


def weigh(rules, user_agent: str, headers: dict[str, str], secure: bool = True):  # type: ignore[no-untyped-def]
    return rules.check_request(browser_claim(user_agent), lambda name: headers.get(name, ""), secure=secure)


def test_browsers_page_loads_carry_no_evidence(rules) -> None:  # type: ignore[no-untyped-def]
    assert weigh(rules, CHROME_UA, CHROME_NAVIGATION) == (0.0, ())
    assert weigh(
        rules, EDGE_UA, {**CHROME_NAVIGATION, "sec-ch-ua": '"Microsoft Edge";v="131", "Chromium";v="131"'}
    ) == (
        0.0,
        (),
    )
    assert weigh(rules, FIREFOX_UA, FIREFOX_NAVIGATION) == (0.0, ())
    assert weigh(rules, SAFARI_UA, FIREFOX_NAVIGATION) == (0.0, ())


def test_old_browsers_without_fetch_metadata_are_not_suspects(rules) -> None:  # type: ignore[no-untyped-def]
    assert weigh(rules, OLD_SAFARI_UA, OLD_BROWSER_NAVIGATION)[0] == 0.0
    assert weigh(rules, IE11_UA, OLD_BROWSER_NAVIGATION)[0] == 0.0
    # A current browser over plain http (not loopback) sends no fetch metadata either: not held against it.
    assert weigh(rules, FIREFOX_UA, OLD_BROWSER_NAVIGATION, secure=False)[0] == 0.0
    # Over https, a current browser without it is odd, but that alone never reaches the threshold.
    weight, reasons = weigh(rules, FIREFOX_UA, OLD_BROWSER_NAVIGATION, secure=True)
    assert reasons == ("no-sec-fetch",) and weight < rules.threshold


@pytest.mark.parametrize("client", sorted(SCRIPTED))
def test_scripted_clients_borrowing_a_chrome_user_agent_are_suspects(rules, client: str) -> None:  # type: ignore[no-untyped-def]
    weight, reasons = weigh(rules, CHROME_UA, SCRIPTED[client], secure=False)
    assert weight >= rules.threshold, (client, reasons)
    assert "no-accept-language" in reasons


def test_client_hints_that_contradict_the_user_agent(rules) -> None:  # type: ignore[no-untyped-def]
    headless = {**CHROME_NAVIGATION, "sec-ch-ua": '"HeadlessChrome";v="156", "Chromium";v="156", "Not=A?Brand";v="24"'}
    assert weigh(rules, CHROME_UA, headless) == (3.0, ("client-hints-contradict-user-agent",))
    assert weigh(rules, FIREFOX_UA, {**FIREFOX_NAVIGATION, "sec-ch-ua": CHROME_NAVIGATION["sec-ch-ua"]})[0] >= 3.0
    only_grease = {**CHROME_NAVIGATION, "sec-ch-ua": '"Not_A Brand";v="8"'}
    assert weigh(rules, CHROME_UA, only_grease) == (0.0, ())


def test_browser_claims() -> None:
    assert browser_claim(CHROME_UA) == ("chrome", 131.0)
    assert browser_claim(EDGE_UA) == ("edge", 131.0)
    assert browser_claim(FIREFOX_UA) == ("firefox", 133.0)
    assert browser_claim(SAFARI_UA) == ("safari", 17.6)
    assert browser_claim("curl/8.5.0") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("threshold = 0", "threshold must be a positive number"),
        ('[[check]]\nname = "x"\nweight = 1\n', "header must name a request header"),
        ('[[check]]\nname = "x"\nweight = 1\nheader = "accept"\n', "say when it fires"),
        ('[[check]]\nname = "Bad Name"\nweight = 1\n', "lower-case words"),
        ('[[check]]\nname = "x"\nweight = 1\nheader = "a"\nabsent = true\nsince = {opera = 1}\n', "since must map"),
        ('[[behaviour]]\nname = "x"\nweight = 1\npages_at_most = 3\n', "unknown key 'pages_at_most'"),
        ('[[behaviour]]\nname = "x"\nweight = 1\nscope = "planet"\npages_at_least = 3\n', "scope must be one of"),
        ("surprise = 1", "unknown key(s) surprise"),
        ("threshold = [", "not valid TOML"),
    ],
)
def test_broken_evidence_rules_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "evidence.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_evidence_rules(path)


def test_the_sketch_stays_within_its_bytes_after_a_million_addresses() -> None:
    budget = 1024 * 1024
    sketch = BehaviourSketch(budget, half_life_s=60)
    before = sketch.nbytes
    assert before <= budget
    now = 1_764_000_000.0
    heavy = "198.51.100.7"
    for number in range(1_000_000):
        address = f"10.{number >> 16 & 255}.{number >> 8 & 255}.{number & 255}"
        sketch.observe_page(address, referer=True, deep=False, cookie=False, now=now + number / 20_000)
        if number % 1000 == 0:
            sketch.observe_page(heavy, referer=False, deep=True, cookie=False, now=now + number / 20_000)
    assert sketch.nbytes == before <= budget
    # The heavy hitter kept its place through the sweep (a page every 50 ms of the sweep: about 40 a minute).
    counts = sketch.counts(heavy, now + 50)
    assert counts is not None and counts[0] > 30


def test_the_sketch_decays_and_groups_networks() -> None:
    sketch = BehaviourSketch(64 * 1024, half_life_s=60)
    for number in range(10):
        sketch.observe_page(f"203.0.113.{number}", referer=False, deep=True, cookie=False, now=1000.0)
    assert sketch.network_counts("203.0.113.200", 1000.0)[0] == pytest.approx(10)  # type: ignore[index]
    assert sketch.counts("203.0.113.1", 1060.0)[0] == pytest.approx(0.5)  # type: ignore[index]
    assert network_of("2001:db8:1234:5678::1") == network_of("2001:db8:1234:ffff::2") != network_of("2001:db8:1235::1")
    assert network_of("::ffff:192.0.2.9") == network_of("192.0.2.200")
    # An IPv6 line picks any address of its /64 at will: its addresses are one client.
    for host in range(20):
        sketch.observe_page(f"2001:db8:7:8::{host:x}", referer=True, deep=False, cookie=False, now=1000.0)
    assert sketch.counts("2001:db8:7:8:ffff::1", 1000.0)[0] == pytest.approx(20)  # type: ignore[index]
    assert client_of("2001:db8:7:8::1") != client_of("2001:db8:7:9::1")


def test_published_ranges_verify_claimants() -> None:
    ranges = load_ranges(default_ranges_file())
    assert ranges.snapshot
    assert ranges.verify("Googlebot", "66.249.66.1") is True
    assert ranges.verify("Googlebot", "203.0.113.9") is False
    assert ranges.verify("Googlebot", "2001:4860:4801:10::1") is True
    assert ranges.verify("Googlebot", "127.0.0.1") is True  # this machine: the operator's own tools
    assert ranges.verify("Googlebot", "not an address") is False
    assert ranges.verify("YandexBot", "203.0.113.9") is None  # no published list: verified by DNS only
    assert ranges.verify("SEO tools", "203.0.113.9") is None


def test_published_lists_in_both_shapes(tmp_path: Path) -> None:
    google = {
        "creationTime": "2026-11-20T00:00:00",
        "prefixes": [{"ipv4Prefix": "66.249.64.0/27"}, {"ipv6Prefix": "2001:4860:4801:10::/64"}],
    }
    assert [str(n) for n in read_published(json.dumps(google), "googlebot.json")] == [
        "66.249.64.0/27",
        "2001:4860:4801:10::/64",
    ]
    text = "# DuckDuckBot\n20.191.45.212\n40.88.21.235  # east\n\n"
    assert [str(n) for n in read_published(text, "ddg.txt")] == ["20.191.45.212/32", "40.88.21.235/32"]
    with pytest.raises(ConfigError, match="'<html>moved</html>' is not an address"):
        read_published("<html>moved</html>\n", "page")
    with pytest.raises(ConfigError, match="no address prefix"):
        read_published('{"prefixes": []}', "empty.json")
    with pytest.raises(ConfigError, match="not an address"):
        read_published("300.1.1.1\n", "bad.txt")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_published("{nope", "bad.json")


def test_reverse_dns_is_checked_forward_too_and_cached() -> None:
    answers = {
        "66.249.90.1": ("crawl-66-249-90-1.googlebot.com.", ["66.249.90.1"]),
        "203.0.113.9": ("crawl-1.googlebot.com.evil.example", ["203.0.113.9"]),  # a name the liar chose
        "198.51.100.4": ("crawl-9.googlebot.com", ["66.249.66.9"]),  # the name resolves elsewhere
    }
    asked: list[str] = []

    def resolve(address: str) -> tuple[str, list[str]]:
        asked.append(address)
        if address not in answers:
            raise OSError("no PTR")
        return answers[address]

    dns = ReverseDns(resolver=resolve)
    suffixes = ("googlebot.com", "google.com")
    for address in (*answers, "192.0.2.1"):
        assert dns.verified(address, suffixes) is None  # not known yet: looked up off the request path
    dns.wait_idle()
    assert [dns.verified(address, suffixes) for address in (*answers, "192.0.2.1")] == [True, False, False, False]
    assert sorted(asked) == sorted([*answers, "192.0.2.1"])  # each once


def test_the_judge_verifies_by_dns_when_asked() -> None:
    metrics = Metrics()
    dns = ReverseDns(resolver=lambda address: ("crawl.googlebot.com", [address]))
    ranges = load_ranges(default_ranges_file())
    judge = Judge(Policy(), metrics, ranges=ranges, dns=dns)
    googlebot = Verdict("crawler", "Googlebot", "search-engine")
    assert judge.claimant(googlebot, "66.249.66.1").verdict is googlebot
    assert judge.claimant(googlebot, "192.0.2.50").verdict is UNVERIFIED_CLAIMANT  # outside the list: asked
    dns.wait_idle()
    assert judge.claimant(googlebot, "192.0.2.50").verdict is googlebot  # its name says Google, both ways
    assert metrics.snapshot()["evidence"] == {"suspects": 0, "unverified_claimants": 1, "reasons": {}}
    families = {"Googlebot": {"requests": 2}, "SEO tools": {"requests": 5}}
    assert judge.verified_claimants(families) == 2  # the families whose claims are checked


def test_policy_table(tmp_path: Path) -> None:
    shipped = load_policy(default_rules_dir() / "policy.toml")
    googlebot = Verdict("crawler", "Googlebot", "search-engine")
    assert shipped.action_for(googlebot) is Action.CACHE
    assert shipped.action_for(SUSPECT_BY_EVIDENCE) is Action.CACHE
    assert shipped.action_for(PERSON.verdict) is Action.LIVE and not shipped.denies
    path = tmp_path / "policy.toml"
    path.write_text(
        '[class]\nsuspect = "cache"\n[tag]\nai-crawler = "cache-only"\nunverified-claimant = "cache-only"\n'
        '[family]\n"Monitors and uptime checks" = "live"\nBytespider = "deny"\n'
    )
    policy = load_policy(path, frozenset({"Monitors and uptime checks", "Bytespider", "OpenAI"}))
    assert policy.action_for(Verdict("crawler", "Monitors and uptime checks", "other")) is Action.LIVE
    assert policy.action_for(Verdict("crawler", "Bytespider", "ai-crawler")) is Action.DENY
    assert policy.action_for(Verdict("crawler", "OpenAI", "ai-crawler")) is Action.CACHE_ONLY
    assert policy.action_for(UNVERIFIED_CLAIMANT) is Action.CACHE_ONLY
    assert policy.action_for(PERSON.verdict) is Action.LIVE  # people are never given anything else
    assert policy.denies


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[class]\nhuman = "cache"\n', "'human' is not known"),
        ('[family]\nGoglebot = "deny"\n', "'Goglebot' is not known"),
        ('[tag]\nsearch-engine = "block"\n', "the action must be one of cache, cache-only, live, deny"),
        ("[rules]\nx = 1\n", "unknown table"),
    ],
)
def test_broken_policy_is_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_policy(path, frozenset({"Googlebot"}))


def test_judge_from_settings_names_a_missing_file(tmp_path: Path) -> None:
    settings = load_settings(environ={}, overrides={"policy.rules_file": str(tmp_path / "none.toml")})
    with pytest.raises(ConfigError, match="does not exist"):
        Judge.from_settings(settings, Metrics())


def test_valve_sheds_on_requests_in_flight_and_on_slowness_then_recovers() -> None:
    valve = OverloadValve(ValveSettings(max_in_flight=2, slow_factor=4, slow_ms=100, window_seconds=10))
    assert not valve.shedding(now=0.0)
    valve.entered()
    valve.entered()
    assert valve.shedding(now=0.0) and valve.status()["shedding"]
    valve.left()
    valve.left()
    assert not valve.shedding(now=0.0)
    for second in range(100):
        valve.sample(20.0, f"page{second % 5}", now=float(second))  # the site's normal: 20 ms
    assert not valve.shedding(now=100.0)
    for tenth in range(5):
        valve.sample(2000.0, f"page{tenth}", now=100.0 + tenth / 10)  # now two seconds, every page
    assert valve.shedding(now=101.0)
    assert not valve.shedding(now=115.0)  # nothing heard in the window: the next miss measures it again
    valve.sample(25.0, "page0", now=116.0)
    assert not valve.shedding(now=116.5)


def test_valve_counts_a_fill_from_when_it_lets_it_through() -> None:
    """Misses decided in one turn, before any of their fills began, are let through only up to the limit."""
    valve = OverloadValve(ValveSettings(max_in_flight=4))
    assert [valve.let_through(f"page{number}", now=0.0) for number in range(6)] == [True] * 4 + [False] * 2
    valve.entered("page0")  # a fill begins: it counts once
    assert not valve.let_through("page4", now=0.1)
    valve.withdrawn("page1")  # another request's fill answers it: its place is free
    assert valve.let_through("page4", now=0.2)
    valve.left()  # page0's fill is over
    assert valve.let_through("page5", now=0.3) and not valve.let_through("page6", now=0.3)
    assert valve.shedding(now=0.3) and valve.in_flight == 0  # four let through, none begun
    assert valve.let_through("page6", now=2.3)  # none began within two seconds: their places are given back
    assert OverloadValve(ValveSettings(enabled=False, max_in_flight=1)).let_through("page", now=0.0)


def test_valve_requests_for_one_page_share_its_place_and_each_gives_back_its_own_share() -> None:
    valve = OverloadValve(ValveSettings(max_in_flight=2))
    # Three requests for one page (one fill between them) take one place: a second page fits.
    assert all(valve.let_through("page", now=0.0) for _ in range(3)) and valve.let_through("other", now=0.0)
    assert not valve.let_through("third", now=0.0)
    valve.withdrawn("page")  # one of them: its fill budget was spent, or it follows the fill under way
    assert not valve.let_through("third", now=0.0)  # the two others still hold the page's place
    valve.entered("page")  # the page's fill begins: in flight, and the last request follows it
    valve.withdrawn("page")
    assert valve.in_flight_now(now=0.0) == 2 and not valve.let_through("third", now=0.0)
    valve.left()
    assert valve.let_through("third", now=0.1)


def test_valve_a_handful_of_slow_pages_never_trips_it() -> None:
    """An attacker's (or a report's) slow pages: the site is not slow, its other pages are not."""
    valve = OverloadValve(ValveSettings(slow_factor=4, slow_ms=100, window_seconds=10))
    for second in range(60):
        valve.sample(20.0, f"page{second % 6}", now=float(second))
    for tenth in range(30):  # one page asked again and again, forty seconds each
        valve.sample(40_000.0, "export", now=60.0 + tenth / 10)
    for page in ("search?q=a", "search?q=b", "search?q=c"):  # slow pages never seen before: no normal yet
        valve.sample(40_000.0, page, now=63.0)
    valve.sample(40_000.0, "page0", now=63.5)  # one known page slow among them
    valve.sample(21.0, "page1", now=63.6)
    valve.sample(22.0, "page2", now=63.7)
    assert not valve.shedding(now=64.0)


def test_valve_works_out_the_window_at_most_every_quarter_second() -> None:
    """The window's medians take a pass over its answers: once per quarter second, not once per miss."""
    valve = OverloadValve(ValveSettings(slow_factor=4, slow_ms=100, window_seconds=10))
    for second in range(30):
        valve.sample(20.0, f"page{second % 5}", now=float(second))
    assert not valve.shedding(now=30.0)
    for page in range(5):
        valve.sample(2000.0, f"page{page}", now=30.05)
    assert not valve.shedding(now=30.2)  # as worked out at 30.0
    assert valve.shedding(now=30.25)


def test_valve_off() -> None:
    valve = OverloadValve(ValveSettings(enabled=False, max_in_flight=1))
    valve.entered()
    assert not valve.shedding()
