"""The nginx include that answers announced crawlers from the published tree, generated from the rules.

Three files: ``crawlergate-hash.conf`` for the top of the ``http`` block (the sizes of the map hash that holds the
known user agents), ``crawlergate-http.conf`` for the ``http`` block (the gate as an upstream, the JSON log
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

The user agents a site's crawlers send most (``known_agents``, learned from its access logs) are looked up in
a hash before any pattern runs: the patterns must all be tried on a crawler's user agent to prove it carries no
person's token, and cost nginx half its direct hits.

    include = nginx_include(settings, gate="127.0.0.1:8080", direct_log=Path("/var/log/nginx/crawlergate.log"),
                            classifier=classifier, seen=user_agent_counts_of_the_logs)
    include.files  # by name
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from crawlergate.classify import MAX_USER_AGENT_CHARS, Classifier, Verdict
from crawlergate.config import Settings
from crawlergate.errors import ConfigError
from crawlergate.metrics import Metrics
from crawlergate.rules import RuleSet, load_site_profiles
from crawlergate.stores.disk import PUBLISHED_FOLDER
from crawlergate.stores.published import CONTENT_TYPE, INDEX_NAME, PLAIN_PATH, host_folder
from crawlergate.suspect.judge import UNVERIFIED_CLAIMANT, Judge
from crawlergate.suspect.policy import Action

HTTP_FILE = "crawlergate-http.conf"
# nginx fixes a map hash's sizes at the first `map` of the http block, so their directives must come before any.
HASH_FILE = "crawlergate-hash.conf"
SERVER_FILE = "crawlergate-server.conf"
DIRECT_OUTCOME = "l2-hit; direct"
# The JSON fields of a direct hit's log line (front/directlog.py reads them).
LOG_FORMAT = (
    '{"msec":$msec,"status":$status,"request_time":$request_time,"bytes":$bytes_sent,'
    '"method":"$request_method","uri":"$request_uri","user_agent":"$http_user_agent","addr":"$remote_addr"}'
)
# Characters an nginx quoted string cannot hold as they are ($ starts a variable).
_UNQUOTABLE = re.compile(r'["\\$\n\r]')
# Alternatives per map entry: PCRE compiles each into one pattern; nginx's limit is far above this.
_CHUNK = 200
# Known user agents in the include at most, and the longest one: nginx's hash of them needs buckets that hold
# the longest (map_hash_bucket_size), and a handful of crawlers send most of a site's crawler requests.
MAX_KNOWN_AGENTS = 1000
MAX_KNOWN_AGENT_CHARS = 400
# Distinct user agents held at most while logs are counted: past it the rarest are dropped, so a bot that sends a
# new user agent with every request cannot take the memory; the frequent ones, the only ones learned, stay.
MAX_COUNTED_AGENTS = 200_000
# User agents counted between two looks at how many distinct ones are held.
_COUNTED_AT_ONCE = 50_000
# Words a map reads as its own parameters even quoted (`"include" 1;` includes a file named 1), lowercase as nginx
# lowercases keys.
_MAP_WORDS = frozenset({"default", "hostnames", "include", "volatile"})


@dataclass(frozen=True, slots=True)
class CrawlerMap:
    """The user-agent maps of the include, cheapest first: nginx works out a map only when another map needs it,
    so a person's request costs one search (``named``), and only a crawler's the rest. Patterns are read
    case-insensitively, as PCRE and Python's re read them alike.

    ``named``: a token of a named family the policy serves from the cache (a pattern per group of ``unless`` words,
    as a look-ahead). ``refused``: never direct: a person's token, another family's token, a program's start.
    ``fields``: a person's field (a phone's model, an app's bracketed fields); when there is one, the token must be
    found outside every field (``outside_fields``), as the classifier blanks fields before it looks.
    """

    named: tuple[str, ...]
    refused: tuple[str, ...]
    fields: str
    outside_fields: tuple[str, ...]

    def says_crawler(self, user_agent: str) -> bool:
        """What nginx's maps decide for a user agent."""
        if not any(_search(pattern, user_agent) for pattern in self.named):
            return False
        if any(_search(pattern, user_agent) for pattern in self.refused):
            return False
        if self.fields and _search(self.fields, user_agent):
            return any(_search(pattern, user_agent) for pattern in self.outside_fields)
        return True


def crawler_map(ruleset: RuleSet, served_families: Iterable[str]) -> CrawlerMap:
    """The maps that tell an announced crawler of a served family, from the rules."""
    served = set(served_families)
    people = sorted({token for token in ruleset.human_tokens if token.isascii()})
    # Another family's tokens may name the crawler first (and the policy may deny it): such a user agent goes to
    # the gate too, as does one that starts like a program the rules name by its start.
    others = sorted({token for rule in ruleset.rules if rule.family is not None and rule.family.name not in served
                     for token in (*rule.contains, *rule.names) if token.isascii()})  # fmt: skip
    starts = sorted({token for rule in ruleset.rules if rule.family is None or rule.family.name not in served
                     for token in rule.starts if token.isascii()})  # fmt: skip
    # The classifier judges a user agent on its first MAX_USER_AGENT_CHARS: a longer one is the gate's.
    refused = [f"^.{{{MAX_USER_AGENT_CHARS + 1}}}"]
    refused += [_alternatives(chunk) for chunk in _chunks(people) + _chunks(others)]
    if starts:
        refused.append("^" + _alternatives(starts))
    by_unless: dict[tuple[str, ...], list[str]] = {}
    for rule in ruleset.rules:
        if rule.family is not None and rule.family.name in served:
            by_unless.setdefault(rule.unless, []).extend(token for token in rule.contains if token.isascii())
    # nginx cannot blank a field as the classifier does, so past a field the token is looked for from the start in
    # steps that take a whole field at once (an atomic group: never half of one), and is never found inside one.
    fields = _quoted("|".join(f"(?:{pattern})" for pattern in ruleset.people_fields))
    named: list[str] = []
    outside: list[str] = []
    for unless, tokens in by_unless.items():
        guard = f"(?!.*{_alternatives(sorted(unless))})" if unless else ""
        for chunk in _chunks(sorted(set(tokens))):
            found = _alternatives(chunk)
            named.append(f"^{guard}.*?{found}" if guard else found)
            outside.append(f"^{guard}(?:(?>{fields}|.))*?{found}")
    return CrawlerMap(tuple(named), tuple(refused), fields, tuple(outside) if fields else ())


def count_user_agents(
    user_agents: Iterable[str], counts: Counter[str] | None = None, limit: int = MAX_COUNTED_AGENTS
) -> Counter[str]:
    """How often each of ``user_agents`` was seen, added to ``counts``, which holds at most ``limit`` distinct ones
    once done: past it, those seen least are dropped (lossy counting; one seen again counts anew), never a frequent
    one."""
    counts = Counter() if counts is None else counts
    floor = 0
    source = iter(user_agents)
    while chunk := list(itertools.islice(source, _COUNTED_AT_ONCE)):
        counts.update(chunk)
        while len(counts) > limit:
            floor += 1
            for rare in [user_agent for user_agent, seen in counts.items() if seen <= floor]:
                del counts[rare]
    return counts


def known_agents(crawlers: CrawlerMap, counts: Counter[str], limit: int = MAX_KNOWN_AGENTS) -> list[str]:
    """The user agents of ``counts`` (how often each was seen) that the maps call a crawler, most frequent first, at
    most ``limit``: each one nginx's hash may answer for the patterns, since it gives what they give.

    nginx matches a map's strings case-insensitively, as the patterns are read: of two that differ in case only, the
    first is kept. A user agent nginx could not take as a quoted key is left to the patterns.
    """
    known: dict[str, str] = {}
    for user_agent, _ in counts.most_common():
        if len(known) >= limit:
            break
        lowered = user_agent.lower()
        if lowered in known or not _quotable_key(user_agent) or not crawlers.says_crawler(user_agent):
            continue
        known[lowered] = user_agent
    return list(known.values())


def _quotable_key(user_agent: str) -> bool:
    return (
        0 < len(user_agent) <= MAX_KNOWN_AGENT_CHARS
        and user_agent.isascii()
        and user_agent.isprintable()
        and not _UNQUOTABLE.search(user_agent)
        and not user_agent.startswith("~")
        and user_agent.lower() not in _MAP_WORDS
    )


def hash_sizes(agents: Sequence[str]) -> str:
    """The file to include at the top of the http block, before any map: the sizes with which nginx can build the hash
    of ``agents``. A bucket holds an entry (a pointer and the key with its length, aligned) and a pointer; a bucket's
    default size (a cache line, 64 bytes) holds keys of 46 characters."""
    lines = [
        "# Generated by `crawlergate nginx-config`: include it at the top of the http block, before any map (nginx",
        "# fixes the sizes of its map hashes at the first one). An nginx.conf that sets these itself keeps the larger.",
    ]
    if not agents:
        return "\n".join([*lines, "# No user agents were learned (--agents-from): nothing to set.", ""])
    # Room for two of the longest in a bucket: with one, nginx finds no table size where no two share a bucket.
    entry = 8 + (max(map(len, agents)) + 2 + 7) // 8 * 8
    bucket = 64
    while bucket < 2 * entry + 8:
        bucket *= 2
    sizes = [f"map_hash_bucket_size {bucket};", f"map_hash_max_size {max(2048, 8 * len(agents))};"]
    return "\n".join([*lines, *sizes, ""])


def served_families(settings: Settings, classifier: Classifier) -> list[str]:
    """The named families whose announced crawlers the policy serves from the cache (not live, not denied).

    nginx sees no address: a family whose claimants the gate verifies (published ranges) is left to the gate when
    the policy treats an unverified claimant otherwise than a crawler it serves from the cache.
    """
    families = classifier.ruleset.families
    judge = Judge.from_settings(settings, Metrics(), (family.name for family in families))
    cached = (Action.CACHE, Action.CACHE_ONLY)
    claimants_cached = judge.policy.action_for(UNVERIFIED_CLAIMANT) in cached
    served = []
    for family in families:
        if judge.policy.action_for(Verdict("crawler", family.name, family.tag)) not in cached:
            continue
        verified = judge.ranges is not None and judge.ranges.verifiable(family.name, by_dns=settings.verify.reverse_dns)
        if verified and not claimants_cached:
            continue
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


@dataclass(frozen=True, slots=True)
class NginxInclude:
    """The include's files by name (the map hash's sizes and the http-level part for the http block, the server-level
    part), and the user agents it answers by a hash lookup."""

    files: dict[str, str]
    known_agents: list[str]


def published_tree(settings: Settings, direct_log: Path) -> Path:
    """The folder nginx answers crawlers from; raises ConfigError, in one line, for settings an include cannot be
    made of (asked before anything long, such as reading logs)."""
    if not settings.site_url:
        raise ConfigError("nginx-config needs the site: --origin or --public-url (server.origin, server.public_url).")
    tree = (settings.cache_dir / PUBLISHED_FOLDER / host_folder(settings.site_url)).resolve()
    for what, path in (("The cache folder", tree), ("The direct-hit log", direct_log)):
        if _UNQUOTABLE.search(str(path)):
            raise ConfigError(f"{what} '{path}' holds a character nginx cannot take in a path (\", $, or a newline).")
    return tree


# An upstream server nginx takes: a name or IPv4 address, or an IPv6 one in brackets, with a port; or a unix socket.
_UPSTREAM_ADDRESS = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})|unix:/[^\s;{}'\"]+")


def _backup_origin(origin: str) -> list[str]:
    """The site itself as the gate's backup, for nginx to send requests to while the gate is down (people keep the
    live site); none for an https origin, which this upstream's plain http cannot reach."""
    if not origin:
        return []
    parts = urlsplit(origin)
    if parts.scheme != "http" or not parts.hostname:
        return ["    # No backup: the site is reached over https, which this upstream does not speak."]
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return [
        "    # While the gate is down (refused or timed out), the site answers everyone itself.",
        f"    server {host}:{parts.port or 80} backup;",
    ]


def nginx_include(
    settings: Settings, *, gate: str, direct_log: Path, classifier: Classifier, seen: Counter[str] | None = None
) -> NginxInclude:
    """The include; ``seen``: how often each user agent asked for something in the site's logs, of which the crawlers'
    seen most are answered by a hash lookup (``known_agents``)."""
    address = _UPSTREAM_ADDRESS.fullmatch(gate)
    if address is None or not 0 < int(address["port"] or 1) < 65536:
        raise ConfigError(
            f"--gate '{gate}' is not an address nginx can reach: write HOST:PORT (127.0.0.1:8080, [::1]:8080) or "
            "unix:/path/to/socket."
        )
    tree = published_tree(settings, direct_log)
    crawlers = crawler_map(classifier.ruleset, served_families(settings, classifier))
    agents = known_agents(crawlers, seen) if seen else []
    lines = [
        "# Generated by `crawlergate nginx-config` from the active rules and settings: regenerate it after",
        "# changing either. Include it in the http block; include crawlergate-server.conf in the server block.",
        "# Put `pcre_jit on;` at the top of nginx.conf: the user-agent maps cost half as much with it.",
        "upstream crawlergate_gate {",
        f"    server {gate};",
        *_backup_origin(settings.server.origin),
        "    keepalive 64;",
        "}",
        "",
        "# One JSON line per crawler hit nginx answers from the published tree; the gate reads it (front.direct_log).",
        f"log_format crawlergate_direct escape=json '{LOG_FORMAT}';",
        "",
        "# An announced crawler of a named family the policy serves from the cache: 1. The user agents seen most in",
        "# the logs nginx-config read (--agents-from) are found by a hash lookup; any other by the patterns below.",
        "map $http_user_agent $crawlergate_crawler {",
        "    default $crawlergate_by_rules;",
        *(f'    "{agent}" 1;' for agent in agents),
        "}",
        "",
        "# Maps are worked out only when needed: a person's request costs the first search; the others run for a",
        "# crawler's.",
        "map $http_user_agent $crawlergate_named {",
        '    default "";',
        *(f'    "~*{pattern}" 1;' for pattern in crawlers.named),
        "}",
        "",
        "map $crawlergate_named $crawlergate_by_rules {",
        '    default "";',
        "    1 $crawlergate_checked;",
        "}",
        "",
        "# Never direct: a person's token, another family's, a program's start. A person's field: the token must be",
        "# found outside it.",
        "map $http_user_agent $crawlergate_checked {",
        *(f'    "~*{pattern}" "";' for pattern in crawlers.refused),
        *([f'    "~*{crawlers.fields}" $crawlergate_outside_fields;'] if crawlers.fields else []),
        "    default 1;",
        "}",
        "",
        "map $http_user_agent $crawlergate_outside_fields {",
        '    default "";',
        *(f'    "~*{pattern}" 1;' for pattern in crawlers.outside_fields),
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
        "# The user agent is looked at last, for a GET or HEAD of a plain URL without a session or credentials.",
        "map $crawlergate_safe_method$crawlergate_guest$crawlergate_plain:$http_authorization $crawlergate_direct {",
        '    "111:" $crawlergate_crawler;',
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
        f'    root "{tree}";',
        "    # A file unpublished must not be answered from a cache of open files.",
        "    open_file_cache off;",
        "    # A link planted in the tree leads nowhere (the folders above the root are the operator's).",
        "    disable_symlinks on from=$document_root;",
        f"    rewrite ^(.*/)$ $1{INDEX_NAME} break;",
        "    # A folder of other pages (/forum when /forum/7 is published) is the gate's: nginx would redirect to it.",
        "    if (-d $request_filename) {",
        "        return 418;",
        "    }",
        "    gzip_static always;",
        "    gunzip on;",
        "    gzip_vary on;",
        "    types { }",
        f'    default_type "{CONTENT_TYPE}";',
        "    if_modified_since before;",
        f'    add_header X-Crawlergate "{DIRECT_OUTCOME}";',
        f'    access_log "{direct_log}" crawlergate_direct buffer=32k flush=250ms;',
        "    log_not_found off;",
        "    # Not published (or no longer), or a folder of other pages (nginx would redirect): the gate answers.",
        "    error_page 301 403 404 = @crawlergate;",
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
    files = {HASH_FILE: hash_sizes(agents), HTTP_FILE: "\n".join(lines), SERVER_FILE: "\n".join(server)}
    return NginxInclude(files, agents)


def _quoted(pattern: str) -> str:
    """A rules' regular expression inside nginx's double quotes: a backslash and a quote as \\xHH escapes."""
    return pattern.replace("\\\\", "\\x5c").replace('"', "\\x22")


def _chunks(tokens: list[str]) -> list[list[str]]:
    return [tokens[start : start + _CHUNK] for start in range(0, len(tokens), _CHUNK)]


def _search(pattern: str, text: str) -> bool:
    return re.search(pattern, text, re.IGNORECASE | re.DOTALL) is not None


def _alternatives(tokens: list[str]) -> str:
    """One pattern matching any of ``tokens``, as a trie (``google(?:bot|other)``): PCRE tries a flat list of
    alternatives one by one at every position, a trie one letter at a time."""
    trie: dict[str, Any] = {}
    for token in tokens:
        node = trie
        for char in token.lower():
            node = node.setdefault(char, {})
        node[""] = {}
    return _trie_pattern(trie)


def _trie_pattern(node: dict[str, Any]) -> str:
    ends = "" in node
    branches = [_escape(char) + _trie_pattern(child) for char, child in sorted(node.items()) if char]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    if ends:
        return f"(?:{body})?"
    return body


def _escape(text: str) -> str:
    """A literal for PCRE and Python alike, safe inside nginx's double quotes: every other character as \\xHH."""
    return "".join(char if char.isalnum() and char.isascii() else f"\\x{ord(char):02x}" for char in text)
