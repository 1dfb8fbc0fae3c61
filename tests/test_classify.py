from __future__ import annotations

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from crawlergate.classify import HUMAN, MAX_USER_AGENT_CHARS, Classifier
from crawlergate.config import ClassifySettings
from crawlergate.rules import CrawlerRule, Family, RuleSet
from tests.conftest import read_user_agents

# The paper's Heuristic 1, one case per branch (Koehl & Wang 2012, section 2.1).
HEURISTIC_TABLE = [
    pytest.param("Googlebot/2.1", "crawler", id="contains-bot"),
    pytest.param("SomeCRAWLER 1.0", "crawler", id="contains-crawler-any-case"),
    pytest.param("Mozilla/5.0 (compatible; Yahoo! Slurp)", "crawler", id="slurp"),
    pytest.param("Mozilla/5.0 Slurp Firefox/3.0", "human", id="slurp-with-firefox"),
    pytest.param("Mediapartners-Google", "crawler", id="mediapartners"),
    pytest.param("Apple-PubSub/65.28", "crawler", id="pubsub"),
    pytest.param("Fetcher (+http://example.com/about)", "crawler", id="http"),
    pytest.param("Mozilla/4.0 (compatible; MSIE 6.0; http://bsalsa.com) ", "human", id="http-with-bsalsa"),
    pytest.param("Avant Browser (http://www.avantbrowser.com)", "human", id="http-with-browser"),
    pytest.param("Mozilla/5.0 (Windows NT 10.0; Win64; x64) Firefox/133.0", "human", id="plain-browser"),
    pytest.param("", "human", id="empty"),
]


@pytest.mark.parametrize(("user_agent", "kind"), HEURISTIC_TABLE)
def test_classify_heuristic_truth_table(paper_classifier: Classifier, user_agent: str, kind: str) -> None:
    assert paper_classifier.classify(user_agent).kind == kind


def test_classify_missing_user_agent_is_human(classifier: Classifier) -> None:
    assert classifier.classify(None) is HUMAN
    assert classifier.classify(b"") is HUMAN


@pytest.mark.parametrize(
    "line", [pytest.param(line, id=line.split("\t")[1][:50]) for line in read_user_agents("crawlers.txt")]
)
def test_classify_recognises_crawler_and_its_tag(classifier: Classifier, line: str) -> None:
    tag, user_agent = line.split("\t", 1)
    verdict = classifier.classify(user_agent)
    assert verdict.is_crawler
    assert verdict.tag == tag


@pytest.mark.parametrize("user_agent", [pytest.param(ua, id=ua[:60]) for ua in read_user_agents("humans.txt")])
def test_classify_never_flags_browsers(classifier: Classifier, user_agent: str) -> None:
    assert classifier.classify(user_agent) is HUMAN


@pytest.mark.parametrize(
    ("user_agent", "family"),
    [
        pytest.param("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "Googlebot"),
        pytest.param("Mozilla/5.0 (compatible; GPTBot/1.0; +https://openai.com/gptbot)", "OpenAI"),
        pytest.param("python-requests/2.31.0", "HTTP libraries"),
        pytest.param("Mozilla/5.0 (compatible; YandexSomethingNew/1.0; +http://yandex.com/bots)", "YandexBot"),
        pytest.param("TotallyNewCrawler/1.0", "unknown"),
    ],
)
def test_classify_names_the_family(classifier: Classifier, user_agent: str, family: str) -> None:
    assert classifier.classify(user_agent).family == family


def test_classify_family_name_token_alone_does_not_make_a_crawler(classifier: Classifier) -> None:
    # "yandex" only names crawlers; the YandexSearch app is a person.
    user_agent = "Mozilla/5.0 (Linux; Android 11) AppleWebKit/537.36 Chrome/120.0 YandexSearch/21.50 Mobile Safari/537"
    assert classifier.classify(user_agent) is HUMAN


def _ruleset(*rules: CrawlerRule, human: tuple[str, ...] = ()) -> RuleSet:
    return RuleSet(rules=rules, human_tokens=human)


def _rule(contains=(), starts=(), unless=(), names=(), family=None) -> CrawlerRule:
    return CrawlerRule(tuple(contains), tuple(starts), tuple(unless), tuple(names), family, "test")


def test_classify_human_token_masks_crawler_token_inside_it() -> None:
    classifier = Classifier(_ruleset(_rule(contains=["bot"]), human=("cubot",)))
    assert classifier.classify("Mozilla/5.0 (Linux; Android 12; CUBOT X30)") is HUMAN
    assert classifier.classify("Mozilla/5.0 (Linux; CUBOT X30) Somebot/1.0").is_crawler


def test_classify_rule_extension_and_exception() -> None:
    family = Family("Example", "seo")
    classifier = Classifier(_ruleset(_rule(contains=["examplefetch"], unless=["examplebrowser"], family=family)))
    assert classifier.classify("ExampleFetch/1.0").family == "Example"
    assert classifier.classify("ExampleFetch/1.0 ExampleBrowser") is HUMAN


def test_classify_starts_matches_only_the_beginning() -> None:
    classifier = Classifier(_ruleset(_rule(starts=["curl"])))
    assert classifier.classify("curl/8.0").is_crawler
    assert classifier.classify("Mozilla/5.0 curl") is HUMAN


def test_classify_empty_ruleset_says_human() -> None:
    assert Classifier(_ruleset()).classify("Googlebot") is HUMAN


@pytest.mark.parametrize(
    ("cookie", "authorization", "expected"),
    [
        pytest.param(None, False, "crawler", id="guest"),
        pytest.param("", False, "crawler", id="empty-cookie"),
        pytest.param("_ga=GA1.2.3; _gid=GA1.2.4; _ga_ABC123=GS1", False, "crawler", id="analytics-only"),
        pytest.param("cookieconsent_status=dismiss; __utma=1.2", False, "crawler", id="consent-and-utm"),
        pytest.param("theme=dark; lang=en", False, "human", id="any-other-cookie"),
        pytest.param("_ga=GA1; trac_auth=0123abcd", False, "human", id="trac-auth"),
        pytest.param("wikidb_session=abc", False, "human", id="mediawiki-session"),
        pytest.param(b"PHPSESSID=1", False, "human", id="session-cookie-bytes"),
        pytest.param(";;  ; ", False, "crawler", id="only-separators"),
        pytest.param(None, True, "human", id="authorization"),
    ],
)
def test_classify_request_any_cookie_but_analytics_makes_human(
    classifier: Classifier, cookie: str | bytes | None, authorization: bool, expected: str
) -> None:
    verdict = classifier.classify_request("Googlebot/2.1", cookie=cookie, authorization=authorization)
    assert verdict.kind == expected


@pytest.mark.parametrize(
    ("cookie", "expected"),
    [
        pytest.param("theme=dark; lang=en", "crawler", id="unrelated-cookies"),
        pytest.param("theme=dark; sessionid=abc", "human", id="session-cookie"),
        pytest.param("wordpress_logged_in_0af3=alice", "human", id="prefix-cookie"),
        pytest.param("trac_auth=0123abcd", "human", id="trac-auth"),
        pytest.param("wikidbUserID=3; wikidbToken=x", "human", id="mediawiki-user"),
        pytest.param("mysessionid=abc", "crawler", id="name-must-match-whole"),
    ],
)
def test_classify_request_named_session_cookies(cookie: str, expected: str) -> None:
    classifier = Classifier.from_settings(ClassifySettings(session_cookie_rule="named"))
    assert classifier.classify_request("Googlebot/2.1", cookie=cookie).kind == expected


@pytest.mark.parametrize(
    "user_agent",
    [
        pytest.param(b"\xff\xfe\x00bot\x80", id="non-utf8-bytes"),
        pytest.param("x" * 65536 + "bot", id="64kb-string"),
        pytest.param("bot\x00\x1b[31m\r\n", id="control-characters"),
        pytest.param("\udcff surrogate", id="lone-surrogate"),
    ],
)
def test_classify_hostile_input_gives_an_answer(classifier: Classifier, user_agent: str | bytes) -> None:
    assert classifier.classify(user_agent).kind in {"crawler", "human"}


def test_classify_judges_long_user_agents_on_their_head(classifier: Classifier) -> None:
    assert classifier.classify("Googlebot/2.1 " + "x" * 100_000).is_crawler
    assert classifier.classify("Mozilla/5.0 (Windows NT 10.0) " + "a" * MAX_USER_AGENT_CHARS + " bot") is HUMAN


def test_classify_memo_is_bounded() -> None:
    classifier = Classifier(_ruleset(_rule(contains=["bot"])), memo_size=8)
    for number in range(100):
        classifier.classify(f"agent {number}")
    assert "currsize=8" in classifier.memo_info()


@hypothesis_settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=400), st.binary(max_size=400), st.none()))
def test_classify_never_raises_and_is_deterministic(classifier: Classifier, user_agent: str | bytes | None) -> None:
    first = classifier.classify(user_agent)
    assert classifier.classify(user_agent) == first
    # The memo changes nothing: the same text judged afresh gives the same verdict.
    expected = classifier.classify_uncached(_as_text(user_agent)) if user_agent else HUMAN
    assert first == expected


def _as_text(user_agent: str | bytes | None) -> str:
    if isinstance(user_agent, bytes):
        return user_agent.decode("latin-1")
    return user_agent or ""
