"""Crawler or human? The paper's Heuristic 1 plus the rules in ``rules/``, in one pass over the user agent.

All tokens of all rules (and the human tokens that mask them) go into one Aho-Corasick automaton
over the lower-cased user agent, so a human user agent costs one linear scan however many rules
there are (ahocorasick-rs: ten times faster than a trie-shaped regular expression here, see
scripts/bench_classify.py). Matches are leftmost-longest, so a human token hides the crawler
tokens inside it; a crawler token whose ``unless`` tokens are absent makes a crawler. Results
are memoised in a bounded LRU, so a repeated user agent costs one dictionary lookup.

    classifier = Classifier.from_settings(settings.classify)
    classifier.classify("Mozilla/5.0 (compatible; Googlebot/2.1)").is_crawler  # True
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ahocorasick_rs import AhoCorasick, MatchKind

from crawlergate.config import ClassifySettings
from crawlergate.rules import CrawlerRule, Family, RuleSet, load_rules, resolve_rule_files

Kind = Literal["crawler", "human", "suspect"]

# Real user agents stay under 1 KB; longer ones are judged on their head, so a hostile 64 KB
# header costs no more than a long real one and cannot bloat the memo.
MAX_USER_AGENT_CHARS = 2048
MEMO_MAX_CHARS = 512

UNKNOWN_FAMILY = "unknown"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a request is: ``kind`` crawler, human or suspect (crawlergate.suspect), and for crawlers the family
    name and its tag."""

    kind: Kind
    family: str
    tag: str

    @property
    def is_crawler(self) -> bool:
        return self.kind == "crawler"


HUMAN = Verdict("human", "", "human")
UNKNOWN_CRAWLER = Verdict("crawler", UNKNOWN_FAMILY, "other")


@dataclass(frozen=True, slots=True)
class _Action:
    unless: tuple[str, ...]
    verdict: Verdict | None  # None: the token makes a crawler without naming it
    makes_crawler: bool
    source: str = ""  # the rule's file and line


PROGRAM_REASON = "starts like a program: no browser prefix or word ([browsers] of the rules)"


class Classifier:
    """Classifies user agents (and whole requests) as crawler or human from a RuleSet.

    Parameters:
        ruleset: the rules, usually from ``load_rules``.
        session_cookies: cookie names that mark a logged-in person; ``*`` matches any run of characters.
        ignored_cookies: with ``any_cookie``, the cookie names that do not (analytics, consent banners).
        any_cookie: every cookie but the ignored ones marks a session (Varnish's default), rather than
            only the named session cookies.
        memo_size: how many distinct user agents to remember (0 turns memoising off).
    """

    def __init__(
        self,
        ruleset: RuleSet,
        *,
        session_cookies: Iterable[str] = (),
        ignored_cookies: Iterable[str] = (),
        any_cookie: bool = False,
        memo_size: int = 65536,
    ) -> None:
        self.ruleset = ruleset
        self._contains: dict[str, _Action | None] = {}
        self._starts: dict[str, _Action | None] = {}
        for token in ruleset.human_tokens:
            self._contains[token] = None  # masked: skipped over whole
        for rule in ruleset.rules:
            self._add_rule(rule)
        self._starts_prefixes = tuple(self._starts)
        # Leftmost-longest, non-overlapping: a masking token ("cubot") hides the shorter tokens inside it ("bot").
        self._automaton = AhoCorasick(list(self._contains), matchkind=MatchKind.LeftmostLongest)
        self._contains_actions = list(self._contains.values())
        self._tokens = list(self._contains)
        fields = "|".join(f"(?:{pattern})" for pattern in ruleset.people_fields)
        self._people_fields = re.compile(fields) if fields else None
        # With no [browsers] section every start is a browser's (the paper's rules alone).
        self._browser_prefixes = ruleset.browser_prefixes or ("",)
        self._session_cookie = _session_cookie_pattern(session_cookies)
        self._any_cookie = any_cookie
        self._ignored_cookie = _cookie_names_pattern(ignored_cookies)
        self.classify_uncached = self._classify
        self._memo: Callable[[str], Verdict] = (
            functools.lru_cache(maxsize=memo_size)(self._classify) if memo_size else self._classify
        )

    @classmethod
    def from_settings(cls, settings: ClassifySettings, extra_session_cookies: Iterable[str] = ()) -> Classifier:
        """Load the configured rule files and build a classifier; raises ConfigError on a broken file."""
        paths = resolve_rule_files(settings.rules_dir, settings.rule_files, settings.extra_rules)
        return cls(
            load_rules(paths),
            session_cookies=(*settings.session_cookies, *extra_session_cookies),
            ignored_cookies=settings.ignored_cookies,
            any_cookie=settings.session_cookie_rule == "any",
            memo_size=settings.memo_size,
        )

    def classify(self, user_agent: str | bytes | None) -> Verdict:
        """The verdict for one user agent; never raises, whatever the input."""
        if not user_agent:
            return HUMAN
        if isinstance(user_agent, bytes):
            # Header bytes are latin-1 in ASGI and WSGI alike; every byte decodes.
            user_agent = user_agent.decode("latin-1")
        elif not isinstance(user_agent, str):
            return HUMAN
        if len(user_agent) > MEMO_MAX_CHARS:
            # Real user agents are shorter; long ones are classified each time, so the memo's memory stays
            # bounded (memo_size x 512 characters) whatever clients send.
            return self._classify(user_agent[:MAX_USER_AGENT_CHARS])
        return self._memo(user_agent)

    def classify_request(
        self, user_agent: str | bytes | None, *, cookie: str | bytes | None = None, authorization: bool = False
    ) -> Verdict:
        """The verdict for a request: a session cookie or credentials make it human, whatever its user agent.

        Crawlers are guests; a logged-in person must never be handed the guest page.
        """
        if authorization or (cookie and self.has_session_cookie(cookie)):
            return HUMAN
        return self.classify(user_agent)

    def has_session_cookie(self, cookie: str | bytes) -> bool:
        """True when a Cookie header carries a session: any cookie not ignored, or a named session cookie."""
        if isinstance(cookie, bytes):
            cookie = cookie.decode("latin-1")
        if self._any_cookie:
            ignored = self._ignored_cookie
            # Some frameworks split on commas too (Rack 2): a cookie hidden behind one still counts.
            for pair in cookie.replace(",", ";").split(";"):
                name = pair.partition("=")[0].strip()
                if name and (ignored is None or ignored.fullmatch(name) is None):
                    return True
            return False
        return self._session_cookie is not None and self._session_cookie.search(cookie) is not None

    def memo_info(self) -> str:
        info = getattr(self._memo, "cache_info", None)
        return str(info()) if info else "memo off"

    def _classify(self, user_agent: str) -> Verdict:
        text = user_agent.lower()
        try:
            read, found = self._reading(text)
        except UnicodeEncodeError:
            # Lone surrogates (from a bytes header decoded with surrogateescape) cannot cross into Rust.
            text = text.encode("utf-8", "replace").decode("utf-8")
            read, found = self._reading(text)
        is_crawler = False
        named: Verdict | None = None
        for action in found.values():
            if action.unless and any(word in read for word in action.unless):
                continue
            if action.makes_crawler:
                if action.verdict is not None:
                    return action.verdict
                is_crawler = True
            elif named is None:
                named = action.verdict
            if is_crawler and named is not None:
                return named
        if is_crawler or self._starts_like_a_program(text, read):
            return UNKNOWN_CRAWLER
        return HUMAN

    def explain(self, user_agent: str) -> tuple[Verdict, str]:
        """The verdict and, for a crawler, what made it one: ``contains "proxy" (rules/crawlers.toml:97)``, or
        ``PROGRAM_REASON``; empty for a person. For tools and tests (it is not memoised)."""
        verdict = self.classify(user_agent)
        if not verdict.is_crawler:
            return verdict, ""
        read, found = self._reading(user_agent[:MAX_USER_AGENT_CHARS].lower().encode("utf-8", "replace").decode())
        for key, action in found.items():
            if action.makes_crawler and not (action.unless and any(word in read for word in action.unless)):
                how, token = ("starts", key) if isinstance(key, str) else ("contains", self._tokens[key])
                return verdict, f'{how} "{token}" ({Path(action.source).name})'
        return verdict, PROGRAM_REASON

    def _reading(self, text: str) -> tuple[str, dict[int | str, _Action]]:
        """The text the rules read (``text`` with the people's fields blanked) and the tokens found in it that act:
        a ``starts`` prefix, or a ``contains`` token by its index."""
        found = self._found(text)
        # Most people's user agents have no token to hide: they skip the fields' regular expression, half of a
        # classification's time.
        if self._people_fields is None or (not found and text.startswith(self._browser_prefixes)):
            return text, found
        blanked = self._people_fields.sub(" ", text)
        if blanked == text:
            return text, found
        # Blanking hides tokens, it never makes one: a token it joins ("feed(Android)(10)(x)reader"), or uncovers
        # inside a person's token it cut in two ("… Build/… latest)"), counts for nothing.
        return blanked, {key: action for key, action in self._found(blanked).items() if key in found}

    def _found(self, text: str) -> dict[int | str, _Action]:
        found: dict[int | str, _Action] = {}
        if text.startswith(self._starts_prefixes):
            for prefix, action in self._starts.items():
                if action and text.startswith(prefix):
                    found[prefix] = action
        for index, _, _ in self._automaton.find_matches_as_indexes(text):
            action = self._contains_actions[index]
            if action is not None:
                found[index] = action
        return found

    def _starts_like_a_program(self, text: str, read: str) -> bool:
        """Whether ``text`` starts like no browser and ``read`` (its fields blanked) names no browser either."""
        if text.startswith(self._browser_prefixes):
            return False
        return not any(word in read for word in self.ruleset.browser_words)

    def _add_rule(self, rule: CrawlerRule) -> None:
        verdict = _verdict(rule.family) if rule.family else None
        maker = _Action(unless=rule.unless, verdict=verdict, makes_crawler=True, source=rule.source)
        for token in rule.contains:
            _register(self._contains, token, maker)
        for token in rule.starts:
            _register(self._starts, token, maker)
        if verdict is not None and rule.names:
            namer = _Action(unless=rule.unless, verdict=verdict, makes_crawler=False, source=rule.source)
            for token in rule.names:
                self._contains.setdefault(token, namer)


def _register(table: dict[str, _Action | None], token: str, action: _Action) -> None:
    """The first rule for a token wins, except that a family's rule replaces a nameless one."""
    existing = table.get(token, action)
    if token not in table or (existing is not None and existing.verdict is None and action.verdict is not None):
        table[token] = action


@functools.cache
def _verdict(family: Family) -> Verdict:
    return Verdict("crawler", family.name, family.tag)


def _cookie_names_pattern(names: Iterable[str]) -> re.Pattern[str] | None:
    alternatives = [re.escape(name).replace(r"\*", ".*") for name in names if name]
    return re.compile("|".join(alternatives)) if alternatives else None


def _session_cookie_pattern(names: Iterable[str]) -> re.Pattern[str] | None:
    alternatives = [re.escape(name).replace(r"\*", "[^=;\\s]*") for name in names if name]
    if not alternatives:
        return None
    return re.compile(r"(?:^|;)\s*(?:" + "|".join(alternatives) + r")\s*=")
