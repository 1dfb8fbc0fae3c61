"""Write rules: the pages a successful unsafe request changes, marked dirty when it succeeds.

A reply to a thread changes the thread's pages, its forum's listing and the front page; the site
need not say so. The rules come from the selected site profiles' ``[[write]]`` tables:

    [[write]]
    methods = ["POST"]
    path = "/newreply.php"
    marks = ["/showthread.php?t={t}*", "/forumdisplay.php*", "/"]

``{name}`` in ``path`` captures one path segment; in ``marks`` it is filled from those captures,
the query string, or the form fields (``application/x-www-form-urlencoded``, the first 64 KB, or
a JSON object's top-level strings and numbers).
Filled values are percent-encoded but for the characters a URL holds literally (``:`` of a wiki
namespace, ``/`` of a subpage), as the cache keys keep them, so a visitor's ``t=*`` can never widen
a pattern and ``Talk:Foo`` marks the page crawlers fetched as ``?title=Talk:Foo``. A mark whose
names are not all given is skipped.

    rules = WriteRules(profile.writes for profile in profiles)
    urls, patterns = rules.marks("POST", "/newreply.php", b"", {"t": "12"})
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, quote

from crawlergate.rules import WriteRule

# Form bodies read for field values, at most, and the content types read.
FORM_BYTES = 64 * 1024
FORM_TYPES = (b"application/x-www-form-urlencoded", b"application/json")
_NAME = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Literal in a filled value: what a query or path holds unescaped and the keys keep so; never "*" (a
# pattern's wildcard), "%", "&", "=", "?", "#" or "+" (a space in a form).
_FILLED_SAFE = ":@!$'(),;/~"


class WriteRules:
    """The write rules of a gate, compiled."""

    def __init__(self, rules: Iterable[WriteRule]) -> None:
        self._rules = [(rule, _path_pattern(rule.path)) for rule in rules]
        self.methods = frozenset(method for rule, _ in self._rules for method in rule.methods)

    def __bool__(self) -> bool:
        return bool(self._rules)

    def wants_form(self, method: str, path: str) -> bool:
        """Whether a request's form fields may fill a mark (so its body is worth reading as it passes)."""
        return any(method in rule.methods and pattern.fullmatch(path) for rule, pattern in self._rules)

    def marks(
        self, method: str, path: str, query: bytes, form: Mapping[str, str] | None = None, location: str = ""
    ) -> tuple[list[str], list[str]]:
        """The pages (URLs, patterns) a successful ``method`` on ``path`` changes; ``location`` is the path and
        query of the answer's Location on this site, if it had one."""
        urls: list[str] = []
        patterns: list[str] = []
        for rule, pattern in self._rules:
            if method not in rule.methods:
                continue
            match = pattern.fullmatch(path)
            if match is None:
                continue
            if rule.follow_location and location.startswith("/"):
                # The page itself, also when the redirect adds a query of its own (?unapproved=N of a comment
                # held for moderation); its other URLs are the rule's marks to name.
                urls.extend(dict.fromkeys((location, location.partition("?")[0])))
            values = {**(form or {}), **_first_values(query), **match.groupdict()}
            for mark in rule.marks:
                filled = _fill(mark, values)
                if filled is not None:
                    (patterns if "*" in filled else urls).append(filled)
        return urls, patterns


def form_fields(body: bytes) -> dict[str, str]:
    """The fields of a request body: an urlencoded form's (first values), or a JSON object's strings and numbers
    (Discourse posts JSON); nothing from a body that is neither, or longer than FORM_BYTES."""
    if body[:1] != b"{":
        return _first_values(body[:FORM_BYTES])
    try:
        data = json.loads(body) if len(body) < FORM_BYTES else None
    except (ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(name): str(value)
        for name, value in data.items()
        if isinstance(value, str | int) and not isinstance(value, bool)
    }


def _first_values(encoded: bytes) -> dict[str, str]:
    values: dict[str, str] = {}
    for name, value in parse_qsl(encoded.decode("latin-1"), keep_blank_values=True):
        values.setdefault(name, value)
    return values


def _path_pattern(path: str) -> re.Pattern[str]:
    parts = []
    position = 0
    for match in _NAME.finditer(path):
        parts.append(re.escape(path[position : match.start()]))
        parts.append(f"(?P<{match.group(1)}>[^/]+)")
        position = match.end()
    parts.append(re.escape(path[position:]))
    return re.compile("".join(parts))


def _fill(mark: str, values: Mapping[str, str]) -> str | None:
    missing = False

    def value(match: re.Match[str]) -> str:
        nonlocal missing
        found = values.get(match.group(1))
        if not found:
            missing = True
            return ""
        return quote(found, safe=_FILLED_SAFE)

    filled = _NAME.sub(value, mark)
    return None if missing else filled
