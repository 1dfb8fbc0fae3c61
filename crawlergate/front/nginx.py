"""The nginx include that answers announced crawlers from the published tree, generated from the rules.

Two files: ``crawlergate-http.conf`` for the ``http`` block (the gate as an upstream, the JSON log
format of direct hits, and the maps that decide which requests nginx may answer by itself) and
``crawlergate-server.conf`` for a ``server`` block (the published tree with ``gzip_static always``
and ``gunzip on``, every other request to the gate).

nginx answers a request from the tree only when all of these hold, and sends it to the gate otherwise:
a GET or HEAD; a user agent of a named crawler family the policy serves from the cache, matched by
the rules' own tokens, with no people's field and no people's token in it (so the map can say
"crawler" only where the classifier does: tests/test_nginx_front.py checks it on the corpus); no
session cookie and no Authorization; a plain path (``PLAIN_PATH``: no escapes, no query, no dot
segments); and a published file for it. Suspects, claimants to verify, people and everything else
stay with the gate.

    files = nginx_include(settings, gate="127.0.0.1:8080", direct_log=Path("/var/log/nginx/crawlergate.log"))
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from crawlergate.classify import Classifier
from crawlergate.config import Settings
from crawlergate.rules import RuleSet, load_site_profiles, resolve_rule_files
from crawlergate.stores.disk import PUBLISHED_FOLDER
from crawlergate.stores.published import CONTENT_TYPE, INDEX_NAME, PLAIN_PATH, host_folder
from crawlergate.suspect.policy import Action, load_policy

HTTP_FILE = "crawlergate-http.conf"
SERVER_FILE = "crawlergate-server.conf"
DIRECT_OUTCOME = "l2-hit; direct"
# The JSON fields of a direct hit's log line (front/directlog.py reads them).
LOG_FORMAT = (
    '{"msec":$msec,"status":$status,"request_time":$request_time,"bytes":$bytes_sent,'
    '"method":"$request_method","uri":"$request_uri","user_agent":"$http_user_agent","addr":"$remote_addr"}'
)
# Alternatives per map entry: PCRE compiles each into one pattern; nginx's limit is far above this.
_CHUNK = 200


@dataclass(frozen=True, slots=True)
class MapEntry:
    """One regular-expression line of the crawler map: case-insensitive, checked in order, first match wins."""

    pattern: str
    crawler: bool


def crawler_map(ruleset: RuleSet, served_families: Iterable[str]) -> list[MapEntry]:
    """The user-agent map's entries: people's fields and tokens first (never direct), then the tokens of the named
    families the policy serves from the cache (with their ``unless`` words as a look-ahead)."""
    entries: list[MapEntry] = []
    # The classifier blanks people's fields (a phone's model, an app's bracketed fields) before it looks for a
    # token. nginx cannot blank, so a crawler's token is looked for from the start in steps that take a whole
    # field at once (an atomic group: never half of one), and is never found inside one.
    fields = "|".join(f"(?:{pattern})" for pattern in ruleset.people_fields)
    skip = f"(?:(?>{_quoted(fields)}|.))*?" if fields else ".*"
    people = sorted({token for token in ruleset.human_tokens if token.isascii()})
    for start in range(0, len(people), _CHUNK):
        entries.append(MapEntry(_alternatives(people[start : start + _CHUNK]), crawler=False))
    served = set(served_families)
    # Another family's tokens may name the crawler first (and the policy may deny it): such a user agent goes to
    # the gate too.
    others = sorted({token for rule in ruleset.rules if rule.family is not None and rule.family.name not in served
                     for token in (*rule.contains, *rule.names) if token.isascii()})  # fmt: skip
    for start in range(0, len(others), _CHUNK):
        entries.append(MapEntry(_alternatives(others[start : start + _CHUNK]), crawler=False))
    starts = sorted({token for rule in ruleset.rules if rule.family is None or rule.family.name not in served
                     for token in rule.starts if token.isascii()})  # fmt: skip
    if starts:
        entries.append(MapEntry("^" + _alternatives(starts), crawler=False))
    by_unless: dict[tuple[str, ...], list[str]] = {}
    for rule in ruleset.rules:
        if rule.family is None or rule.family.name not in served:
            continue
        by_unless.setdefault(rule.unless, []).extend(token for token in rule.contains if token.isascii())
    for unless, tokens in by_unless.items():
        unique = sorted(set(tokens))
        for start in range(0, len(unique), _CHUNK):
            found = _alternatives(unique[start : start + _CHUNK])
            guard = f"(?!.*{_alternatives(sorted(unless))})" if unless else ""
            entries.append(MapEntry(f"^{guard}{skip}{found}", crawler=True))
    return entries


def map_says_crawler(entries: list[MapEntry], user_agent: str) -> bool:
    """What nginx's map decides for a user agent (Python's re reads these patterns as PCRE does)."""
    for entry in entries:
        if re.search(entry.pattern, user_agent, re.IGNORECASE | re.DOTALL):
            return entry.crawler
    return False


def served_families(settings: Settings, classifier: Classifier) -> list[str]:
    """The named families whose announced crawlers the policy serves from the cache (not live, not denied)."""
    path = resolve_rule_files(settings.classify.rules_dir, (settings.policy.rules_file,), ())[0]
    families = classifier.ruleset.families
    policy = load_policy(path, frozenset(family.name for family in families))
    served = []
    for family in families:
        action = policy.families.get(family.name) or policy.tags.get(family.tag) or policy.classes.get("crawler")
        if action in (Action.CACHE, Action.CACHE_ONLY):
            served.append(family.name)
    return served


def session_cookie_map(settings: Settings, classifier: Classifier) -> list[str]:
    """The body of the map that says 1 for a request without a session cookie (the classifier's rule)."""
    if settings.classify.session_cookie_rule == "any":
        # Any cookie may be a session: only a request without cookies is answered by nginx.
        return ['"" 1;', 'default "";']
    profiles = load_site_profiles(settings.classify.rules_dir, settings.cache.sites)
    names = [*settings.classify.session_cookies, *(name for p in profiles for name in p.session_cookies)]
    alternatives = "|".join(_escape(name).replace(r"\x2a", "[^=;\\x20\\x09]*") for name in names if name)
    if not alternatives:
        return ["default 1;"]
    return [f'"~(?:^|;)[\\x20\\x09]*(?:{alternatives})[\\x20\\x09]*=" "";', "default 1;"]


def nginx_include(settings: Settings, *, gate: str, direct_log: Path, classifier: Classifier) -> dict[str, str]:
    """The two files of the include, by name: the http-level part and the server-level part."""
    entries = crawler_map(classifier.ruleset, served_families(settings, classifier))
    tree = (settings.cache_dir / PUBLISHED_FOLDER / host_folder(settings.site_url)).resolve()
    lines = [
        "# Generated by `crawlergate nginx-config` from the active rules and settings: regenerate it after",
        "# changing either. Include it in the http block; include crawlergate-server.conf in the server block.",
        "upstream crawlergate_gate {",
        f"    server {gate};",
        "    keepalive 64;",
        "}",
        "",
        "# One JSON line per crawler hit nginx answers from the published tree; the gate reads it (front.direct_log).",
        f"log_format crawlergate_direct escape=json '{LOG_FORMAT}';",
        "",
        "# A named crawler family the policy serves from the cache: 1. People's fields and tokens come first.",
        "map $http_user_agent $crawlergate_crawler {",
        '    default "";',
        *(f'    "~*{entry.pattern}" {"1" if entry.crawler else chr(34) * 2};' for entry in entries),
        "}",
        "",
        "map $request_method $crawlergate_safe_method {",
        "    GET 1;",
        "    HEAD 1;",
        '    default "";',
        "}",
        "",
        "# No session cookie: 1.",
        "map $http_cookie $crawlergate_guest {",
        *(f"    {line}" for line in session_cookie_map(settings, classifier)),
        "}",
        "",
        "# A plain path, equal to its cache key, and no query string: 1.",
        "map $request_uri $crawlergate_plain {",
        f'    "~{PLAIN_PATH}" 1;',
        '    default "";',
        "}",
        "",
        "map $crawlergate_safe_method$crawlergate_crawler$crawlergate_guest$crawlergate_plain:$http_authorization "
        "$crawlergate_direct {",
        '    "1111:" 1;',
        '    default "";',
        "}",
        "",
        "map $http_upgrade $crawlergate_connection {",
        "    default upgrade;",
        '    "" "";',
        "}",
        "",
    ]
    server = [
        "# Generated by `crawlergate nginx-config`: include it in the server block of the site.",
        "location / {",
        "    # Not a candidate for the tree: straight to the gate.",
        "    error_page 418 = @crawlergate;",
        '    if ($crawlergate_direct = "") {',
        "        return 418;",
        "    }",
        f"    root {tree};",
        "    disable_symlinks on;",
        f"    rewrite ^(.*/)$ $1{INDEX_NAME} break;",
        "    gzip_static always;",
        "    gunzip on;",
        "    gzip_vary on;",
        "    types { }",
        f'    default_type "{CONTENT_TYPE}";',
        "    if_modified_since before;",
        f'    add_header X-Crawlergate "{DIRECT_OUTCOME}";',
        f"    access_log {direct_log} crawlergate_direct;",
        "    log_not_found off;",
        "    # Not published (or no longer): the gate answers, from its cache or the site.",
        "    error_page 403 404 = @crawlergate;",
        "}",
        "",
        "location @crawlergate {",
        "    proxy_pass http://crawlergate_gate$request_uri;",
        "    proxy_http_version 1.1;",
        "    proxy_set_header Upgrade $http_upgrade;",
        "    proxy_set_header Connection $crawlergate_connection;",
        "    proxy_set_header Host $host;",
        "    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "    proxy_set_header X-Forwarded-Proto $scheme;",
        "    proxy_set_header X-Forwarded-Host $host;",
        "    proxy_buffering off;",
        "    gzip off;",
        "}",
        "",
    ]
    return {HTTP_FILE: "\n".join(lines), SERVER_FILE: "\n".join(server)}


def _quoted(pattern: str) -> str:
    """A rules' regular expression inside nginx's double quotes: a backslash and a quote as \\xHH escapes."""
    return pattern.replace("\\\\", "\\x5c").replace('"', "\\x22")


def _alternatives(tokens: list[str]) -> str:
    return "(?:" + "|".join(_escape(token) for token in tokens) + ")"


def _escape(text: str) -> str:
    """A literal for PCRE and Python alike, safe inside nginx's double quotes: every other character as \\xHH."""
    return "".join(char if char.isalnum() and char.isascii() else f"\\x{ord(char):02x}" for char in text)
