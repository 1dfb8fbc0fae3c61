"""Rules are data: this module reads ``rules/*.toml`` into value objects.

A crawler rule fires when the lower-cased user agent *contains* one of its tokens or *starts*
with one, and none of its *unless* tokens occurs anywhere in it. Human tokens are masked before
matching, so the "bot" inside the phone brand "Cubot" never fires. A family names the crawler
(Googlebot, GPTBot, python-requests) and tags its class; its ``contains``/``starts`` tokens make a
crawler, its ``names`` tokens only name one that another rule already recognised.

    ruleset = load_rules([default_rules_dir() / "heuristic.toml"])
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from crawlergate.errors import ConfigError

CrawlerTag = Literal["search-engine", "ai-crawler", "seo", "social-preview", "library", "other"]
CRAWLER_TAGS: tuple[str, ...] = get_args(CrawlerTag)

_TOKEN_KEYS = ("contains", "starts", "unless", "names")


@dataclass(frozen=True, slots=True)
class Family:
    """A named group of crawlers with a class tag, e.g. ``Family("Googlebot", "search-engine")``."""

    name: str
    tag: CrawlerTag


@dataclass(frozen=True, slots=True)
class CrawlerRule:
    """Tokens that make a user agent a crawler, with the place in the rules file they came from."""

    contains: tuple[str, ...]
    starts: tuple[str, ...]
    unless: tuple[str, ...]
    names: tuple[str, ...]
    family: Family | None
    source: str


@dataclass(frozen=True, slots=True)
class RuleSet:
    """Everything the classifier needs, merged from one or more rule files in order."""

    rules: tuple[CrawlerRule, ...]
    human_tokens: tuple[str, ...]
    # A user agent that starts with none of these prefixes and holds none of these words is a program.
    browser_prefixes: tuple[str, ...] = ()
    browser_words: tuple[str, ...] = ()
    # Regular expressions for the parts of a user agent where a crawler word means nothing (a device's model, an
    # app's bracketed fields, a locale): blanked before any token is matched.
    people_fields: tuple[str, ...] = ()

    @property
    def families(self) -> tuple[Family, ...]:
        return tuple(dict.fromkeys(rule.family for rule in self.rules if rule.family is not None))


def default_rules_dir() -> Path:
    """The rules shipped with crawlergate: inside the installed package, or beside it in a source checkout."""
    package = Path(__file__).resolve().parent
    installed = package / "rules"
    return installed if installed.is_dir() else package.parent / "rules"


def resolve_rule_files(rules_dir: str, rule_files: Sequence[str], extra_rules: Sequence[str]) -> list[Path]:
    """The rule files a ClassifySettings names, as paths."""
    base = Path(rules_dir) if rules_dir else default_rules_dir()
    return [base / name for name in rule_files] + [Path(name) for name in extra_rules]


def rules_fingerprint(paths: Iterable[Path]) -> str:
    """A digest of the rule files' contents: it changes exactly when the rules do."""
    digest = hashlib.blake2b(digest_size=12)
    for path in paths:
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(str(path).encode())
    return digest.hexdigest()


def load_rules(paths: Iterable[Path]) -> RuleSet:
    """Read and merge rule files; a broken file raises ConfigError naming the file and line."""
    rules: list[CrawlerRule] = []
    human_tokens: list[str] = []
    browser_prefixes: list[str] = []
    browser_words: list[str] = []
    people_fields: list[str] = []
    for path in paths:
        parsed = _parse_file(path)
        rules.extend(parsed.rules)
        human_tokens.extend(parsed.human_tokens)
        browser_prefixes.extend(parsed.browser_prefixes)
        browser_words.extend(parsed.browser_words)
        people_fields.extend(parsed.people_fields)
    return RuleSet(
        rules=tuple(rules),
        human_tokens=tuple(dict.fromkeys(human_tokens)),
        browser_prefixes=tuple(dict.fromkeys(browser_prefixes)),
        browser_words=tuple(dict.fromkeys(browser_words)),
        people_fields=tuple(dict.fromkeys(people_fields)),
    )


def _parse_file(path: Path) -> RuleSet:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"Rules file '{path}' does not exist.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Rules file '{path}' cannot be read: {exc}.") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}.") from None
    where = _Locator(path, text)
    unknown = set(data) - {"human", "browsers", "crawler", "family"}
    if unknown:
        raise ConfigError(
            f"{where.of(min(unknown))}: unknown table '{min(unknown)}'; use human, browsers, crawler or family."
        )

    human = data.get("human", {})
    if not isinstance(human, dict) or set(human) - {"contains", "fields"}:
        raise ConfigError(
            f"{where.of('[human]')}: [human] takes contains = [tokens] and fields = [regular expressions]."
        )
    human_tokens = _tokens(human, "contains", where, "[human]")
    people_fields = _patterns(human, "fields", where)
    browsers = data.get("browsers", {})
    if not isinstance(browsers, dict) or set(browsers) - {"starts", "contains"}:
        raise ConfigError(f"{where.of('[browsers]')}: [browsers] takes starts = [prefixes] and contains = [words].")
    browser_prefixes = _tokens(browsers, "starts", where, "[browsers]")
    browser_words = _tokens(browsers, "contains", where, "[browsers]")

    rules = [_crawler_rule(entry, where, "[[crawler]]", family=None) for entry in _tables(data, "crawler", where)]
    for entry in _tables(data, "family", where):
        rules.append(_crawler_rule(entry, where, "[[family]]", family=_family(entry, where)))
    return RuleSet(
        rules=tuple(rules),
        human_tokens=human_tokens,
        browser_prefixes=browser_prefixes,
        browser_words=browser_words,
        people_fields=people_fields,
    )


def _patterns(table: dict[str, Any], key: str, where: _Locator) -> tuple[str, ...]:
    """Regular expressions (matched against the lower-cased user agent); a broken one names its line."""
    patterns = table.get(key, [])
    if not isinstance(patterns, list) or not all(isinstance(pattern, str) and pattern for pattern in patterns):
        raise ConfigError(f"{where.of(key)}: [human] {key} must be a list of regular expressions.")
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            message = f"{where.of(pattern)}: [human] {key}: {pattern!r} is no regular expression: {exc}."
            raise ConfigError(message) from None
    return tuple(patterns)


def _tables(data: dict[str, Any], name: str, where: _Locator) -> list[dict[str, Any]]:
    tables = data.get(name, [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{where.of(name)}: '{name}' must be an array of tables, written [[{name}]].")
    return tables


def _family(entry: dict[str, Any], where: _Locator) -> Family:
    name, tag = entry.get("name"), entry.get("tag")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f'{where.of("[[family]]")}: every [[family]] needs name = "...".')
    if tag not in CRAWLER_TAGS:
        raise ConfigError(f"{where.of(name)}: family '{name}' has tag {tag!r}; use one of {', '.join(CRAWLER_TAGS)}.")
    return Family(name=name, tag=tag)


def _crawler_rule(entry: dict[str, Any], where: _Locator, table: str, family: Family | None) -> CrawlerRule:
    allowed = set(_TOKEN_KEYS) | ({"name", "tag"} if family else set())
    extra = set(entry) - allowed
    if extra:
        key = min(extra)
        raise ConfigError(f"{where.of(key)}: {table} has unknown key '{key}'; allowed: {', '.join(sorted(allowed))}.")
    tokens = {key: _tokens(entry, key, where, table) for key in _TOKEN_KEYS}
    if not (tokens["contains"] or tokens["starts"] or tokens["names"]):
        raise ConfigError(f"{where.of(table)}: a {table} needs at least one of contains, starts or names.")
    if family is None and tokens["names"]:
        raise ConfigError(f"{where.of('names')}: 'names' belongs in a [[family]], not a [[crawler]].")
    first = next(iter(tokens["contains"] + tokens["starts"] + tokens["names"]))
    return CrawlerRule(
        contains=tokens["contains"],
        starts=tokens["starts"],
        unless=tokens["unless"],
        names=tokens["names"],
        family=family,
        source=where.of(first),
    )


def _tokens(entry: dict[str, Any], key: str, where: _Locator, table: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(token, str) for token in value):
        raise ConfigError(f"{where.of(key)}: {table} key '{key}' must be a list of strings.")
    for token in value:
        if not token.strip():
            raise ConfigError(f"{where.of(key)}: {table} key '{key}' holds an empty token, which would match anything.")
    return tuple(token.lower() for token in value)


class _Locator:
    """Finds the line of a rules file that holds a piece of text, so errors can say file:line."""

    def __init__(self, path: Path, text: str) -> None:
        self._path = path
        self._lines = text.lower().splitlines()

    def of(self, needle: str) -> str:
        needle = needle.lower()
        for number, line in enumerate(self._lines, start=1):
            if needle in line:
                return f"{self._path}:{number}"
        return str(self._path)


@dataclass(frozen=True, slots=True)
class CacheRules:
    """Which paths are cacheable and which query parameters count, from ``rules/cache.toml``."""

    include: re.Pattern[str]
    exclude: re.Pattern[str] | None
    static_extensions: tuple[str, ...]
    drop_params: re.Pattern[str] | None
    keep_params: dict[str, frozenset[str]]
    # "name" or "name=value-glob": a URL whose query has such a parameter is not cacheable.
    exclude_params: re.Pattern[str] | None = None
    # The exclude patterns as written, to name the one that matched.
    exclude_patterns: tuple[str, ...] = ()
    # Per-path lifetimes of 200 pages, first match wins: (path glob, seconds), from [[max_age]].
    max_ages: tuple[tuple[re.Pattern[str], float], ...] = ()
    # A site profile's [storage] ignore_no_store: the site sends no-store on guest pages too (DokuWiki).
    ignore_no_store: bool = False

    def max_age_for(self, path: str) -> float | None:
        """The lifetime a [[max_age]] rule gives a page of ``path``, or None."""
        for pattern, seconds in self.max_ages:
            if pattern.fullmatch(path):
                return seconds
        return None


@dataclass(frozen=True, slots=True)
class SiteProfile:
    """What one kind of site needs on top of the cache rules, from ``rules/sites/NAME.toml``."""

    name: str
    title: str
    notes: str
    exclude: tuple[str, ...]
    drop_params: tuple[str, ...]
    keep_params: dict[str, frozenset[str]]
    session_cookies: tuple[str, ...]
    exclude_params: tuple[str, ...] = ()
    writes: tuple[WriteRule, ...] = ()
    # [storage] ignore_no_store: guest pages are stored despite Cache-Control: no-store, which the site
    # sends to everyone because it opens a session for everyone (a guest fill has none).
    ignore_no_store: bool = False


@dataclass(frozen=True, slots=True)
class WriteRule:
    """An unsafe request that, when it succeeds, changes these pages (``[[write]]`` in a site profile).

    ``path`` is the request's path, where ``{name}`` captures one path segment; ``marks`` are pages
    (``/showthread.php?t={t}``) or patterns with ``*``, whose ``{name}`` come from the path's captures,
    the query string or the request's form fields. ``follow_location`` also marks the page the answer's
    ``Location`` names on this site (WordPress answers a comment with a redirect to its post's permalink).
    """

    methods: frozenset[str]
    path: str
    marks: tuple[str, ...]
    follow_location: bool = False


def load_cache_rules(path: Path, profiles: Sequence[SiteProfile] = ()) -> CacheRules:
    """Read a cache rules file and add the profiles' rules; a broken file raises ConfigError naming file and line."""
    data, where = _read_toml_rules(path, "Cache rules file")
    unknown = set(data) - {"paths", "query", "max_age"}
    if unknown:
        raise ConfigError(
            f"{where.of(min(unknown))}: unknown table '{min(unknown)}'; use [paths], [query] and [[max_age]]."
        )
    paths = _table(data, "paths", {"include", "exclude", "static_extensions"}, where)
    query = _table(data, "query", {"drop", "keep", "exclude"}, where)
    keep = _keep_params(query, where)
    include = _raw_strings(paths, "include", where) or ["/*"]
    exclude = _raw_strings(paths, "exclude", where)
    drop = list(_tokens(query, "drop", where, "[query]"))
    exclude_params = _raw_strings(query, "exclude", where)
    for profile in profiles:
        exclude.extend(profile.exclude)
        drop.extend(profile.drop_params)
        keep.update(profile.keep_params)
        exclude_params.extend(profile.exclude_params)
    return CacheRules(
        include=_globs(include, ignore_case=False),
        exclude=_globs(exclude, ignore_case=False) if exclude else None,
        static_extensions=_tokens(paths, "static_extensions", where, "[paths]"),
        drop_params=_globs(drop, ignore_case=True) if drop else None,
        keep_params=keep,
        exclude_params=_globs([_param_glob(p) for p in exclude_params], ignore_case=True) if exclude_params else None,
        exclude_patterns=tuple(exclude) + tuple(f"?{p}" for p in exclude_params),
        max_ages=tuple(_max_age(entry, where) for entry in _tables(data, "max_age", where)),
        ignore_no_store=any(profile.ignore_no_store for profile in profiles),
    )


def _max_age(entry: dict[str, Any], where: _Locator) -> tuple[re.Pattern[str], float]:
    path, seconds = entry.get("path"), entry.get("seconds")
    if set(entry) - {"path", "seconds"} or not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError(f'{where.of("[[max_age]]")}: each [[max_age]] is path = "/glob" and seconds = N.')
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise ConfigError(f"{where.of(path)}: [[max_age]] seconds must be a positive number.")
    return _globs([path], ignore_case=False), float(seconds)


def _param_glob(pattern: str) -> str:
    # "search" excludes the parameter with any value; "title=Special:*" only those values.
    return pattern if "=" in pattern else pattern + "=*"


def rules_folder(rules_dir: str) -> Path:
    """The rules folder a ``classify.rules_dir`` setting names: the shipped rules when it is empty."""
    return Path(rules_dir) if rules_dir else default_rules_dir()


def site_profiles_dir(rules_dir: str) -> Path:
    return rules_folder(rules_dir) / "sites"


def load_site_profiles(rules_dir: str, names: Sequence[str]) -> list[SiteProfile]:
    """The named profiles from ``rules/sites/``; an unknown name raises ConfigError listing the known ones."""
    folder = site_profiles_dir(rules_dir)
    profiles = []
    for name in names:
        path = folder / f"{name}.toml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in folder.glob("*.toml"))) or "none"
            raise ConfigError(f"Setting 'cache.sites' names '{name}', which is no site profile. Known: {known}.")
        profiles.append(load_site_profile(path))
    return profiles


def load_site_profile(path: Path) -> SiteProfile:
    data, where = _read_toml_rules(path, "Site profile")
    unknown = set(data) - {"site", "paths", "query", "cookies", "storage", "write"}
    if unknown:
        raise ConfigError(
            f"{where.of(min(unknown))}: unknown table '{min(unknown)}'; "
            "use [site], [paths], [query], [cookies], [storage] and [[write]]."
        )
    site = _table(data, "site", {"name", "notes"}, where)
    paths = _table(data, "paths", {"exclude"}, where)
    query = _table(data, "query", {"drop", "keep", "exclude"}, where)
    cookies = _table(data, "cookies", {"session"}, where)
    storage = _table(data, "storage", {"ignore_no_store"}, where)
    ignore_no_store = storage.get("ignore_no_store", False)
    if not isinstance(ignore_no_store, bool):
        raise ConfigError(f"{where.of('ignore_no_store')}: 'ignore_no_store' must be true or false.")
    texts = {key: site.get(key, "") for key in ("name", "notes")}
    for key, value in texts.items():
        if not isinstance(value, str):
            raise ConfigError(f"{where.of(key)}: '{key}' must be a string.")
    return SiteProfile(
        name=path.stem,
        title=texts["name"] or path.stem,
        notes=" ".join(texts["notes"].split()),
        exclude=tuple(_raw_strings(paths, "exclude", where)),
        drop_params=_tokens(query, "drop", where, "[query]"),
        keep_params=_keep_params(query, where),
        session_cookies=tuple(_raw_strings(cookies, "session", where)),
        exclude_params=tuple(_raw_strings(query, "exclude", where)),
        writes=tuple(_write_rule(entry, where) for entry in _tables(data, "write", where)),
        ignore_no_store=ignore_no_store,
    )


_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _write_rule(entry: dict[str, Any], where: _Locator) -> WriteRule:
    extra = set(entry) - {"methods", "path", "marks", "follow_location"}
    if extra:
        raise ConfigError(
            f"{where.of(min(extra))}: [[write]] has unknown key '{min(extra)}'; use methods, path, marks, "
            "follow_location."
        )
    follow_location = entry.get("follow_location", False)
    if not isinstance(follow_location, bool):
        raise ConfigError(f"{where.of('follow_location')}: [[write]] follow_location must be true or false.")
    path = entry.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError(f'{where.of("[[write]]")}: every [[write]] needs path = "/..." (the request\'s path).')
    methods = frozenset(method.upper() for method in _raw_strings(entry, "methods", where)) or _UNSAFE_METHODS
    if not methods <= _UNSAFE_METHODS:
        raise ConfigError(f"{where.of(path)}: [[write]] methods must be among {', '.join(sorted(_UNSAFE_METHODS))}.")
    marks = tuple(_raw_strings(entry, "marks", where))
    if not marks or not all(mark.startswith("/") for mark in marks):
        raise ConfigError(f'{where.of(path)}: [[write]] needs marks = ["/page", ...], each starting with /.')
    for mark in marks:
        if "}*" in mark:
            # A visitor's value followed by * is a prefix of their choosing: title=M would mark every M... page.
            raise ConfigError(
                f"{where.of(mark)}: in [[write]] marks, '{{name}}*' lets a visitor choose a prefix; "
                "end the value with & and * (e.g. ?t={t}&*) to allow other parameters."
            )
    return WriteRule(methods=methods, path=path, marks=marks, follow_location=follow_location)


def _read_toml_rules(path: Path, what: str) -> tuple[dict[str, Any], _Locator]:
    data, text = _read_toml_text(path, what)
    return data, _Locator(path, text)


def read_toml(path: Path, what: str, setting: str = "") -> dict[str, Any]:
    """A rules file's TOML; ConfigError in one sentence when it is missing, unreadable or not TOML (``what`` names
    the file's kind, ``setting`` the setting that chose it)."""
    return _read_toml_text(path, what, setting)[0]


def _read_toml_text(path: Path, what: str, setting: str = "") -> tuple[dict[str, Any], str]:
    chosen_by = f" ({setting})" if setting else ""
    try:
        text = path.read_text(encoding="utf-8")
        return tomllib.loads(text), text
    except FileNotFoundError:
        raise ConfigError(f"{what} '{path}' does not exist{chosen_by}.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} '{path}' cannot be read: {exc}.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}.") from None


def _keep_params(query: dict[str, Any], where: _Locator) -> dict[str, frozenset[str]]:
    keep: dict[str, frozenset[str]] = {}
    for entry in query.get("keep", []):
        if not isinstance(entry, dict) or set(entry) != {"path", "params"} or not isinstance(entry["path"], str):
            raise ConfigError(
                f'{where.of("[[query.keep]]")}: each [[query.keep]] needs path = "..." and params = [...].'
            )
        keep[entry["path"]] = frozenset(_tokens(entry, "params", where, "[[query.keep]]"))
    return keep


def _table(data: dict[str, Any], name: str, keys: set[str], where: _Locator) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{where.of(name)}: '{name}' must be a table, written [{name}].")
    extra = set(table) - keys
    if extra:
        raise ConfigError(
            f"{where.of(min(extra))}: [{name}] has unknown key '{min(extra)}'; allowed: {', '.join(sorted(keys))}."
        )
    return table


def _raw_strings(table: dict[str, Any], key: str, where: _Locator) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ConfigError(f"{where.of(key)}: '{key}' must be a list of non-empty strings.")
    return value


def _globs(patterns: Iterable[str], *, ignore_case: bool) -> re.Pattern[str]:
    return re.compile("|".join(fnmatch.translate(p) for p in patterns), re.IGNORECASE if ignore_case else 0)
