"""The evidence rules (``rules/evidence.toml``) and the checks of one request against them.

A request that the user-agent rules call human claims a browser; a real browser's page load
carries headers that scripted clients borrowing its user agent leave out. Each check names a
header, what would be wrong with it, and which browser versions send it; their weights add up
with the behaviour rules' (``sketch.py``) against one threshold.

    rules = load_evidence_rules(Path("rules/evidence.toml"))
    weight, reasons = rules.check_request(browser_claim(ua), headers.get, secure=True)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from crawlergate.errors import ConfigError
from crawlergate.rules import read_toml

BROWSERS = ("chrome", "edge", "firefox", "safari")
BEHAVIOUR_FIELDS = ("pages", "assets", "deep_without_referer", "cookies_offered", "cookies_returned")
SCOPES = ("address", "network")

_EDGE = re.compile(r"\bEdg(?:e|A|iOS)?/(\d+)")
_CHROME = re.compile(r"\b(?:Chrome|CriOS)/(\d+)")
_FIREFOX = re.compile(r"\b(?:Firefox|FxiOS)/(\d+)")
_SAFARI = re.compile(r"\bVersion/(\d+(?:\.\d+)?).*\bSafari/")
_HINT_BRAND = re.compile(r'"([^"]*)"\s*;\s*v\s*=\s*"(\d+)')
# The brands of sec-ch-ua that name the browser (the others are GREASE, "Not A(Brand" and the like).
_HINT_BROWSERS = {"google chrome": "chrome", "chromium": "chrome", "microsoft edge": "edge", "headlesschrome": "chrome"}


class BrowserClaim(NamedTuple):
    """The browser a user agent claims to be, and its major version (Safari's "16.4" as 16.4)."""

    name: str
    version: float


@functools.lru_cache(maxsize=4096)
def browser_claim(user_agent: str) -> BrowserClaim | None:
    """The browser ``user_agent`` claims, or None when it names none of Chrome, Edge, Firefox and Safari."""
    for name, pattern in (("edge", _EDGE), ("firefox", _FIREFOX), ("chrome", _CHROME), ("safari", _SAFARI)):
        match = pattern.search(user_agent)
        if match:
            return BrowserClaim(name, float(match.group(1)))
    return None


@dataclass(frozen=True, slots=True)
class RequestCheck:
    """One header a claimed browser's page load must carry, and what must be in it."""

    name: str
    weight: float
    header: str
    absent: bool = False
    equals: tuple[str, ...] = ()
    lacks: tuple[str, ...] = ()
    contradicts_user_agent: bool = False
    secure_only: bool = False
    since: Mapping[str, float] | None = None

    def applies(self, claim: BrowserClaim | None, secure: bool) -> bool:
        if self.secure_only and not secure:
            return False
        if claim is None:
            # No browser named (an empty or bare user agent): what every browser sends still counts.
            return self.since is None and not self.contradicts_user_agent
        if self.since is None:
            return True
        oldest = self.since.get(claim.name)
        return oldest is not None and claim.version >= oldest

    def fires(self, value: str, claim: BrowserClaim | None) -> bool:
        """Whether the header's value (empty when absent) betrays a program."""
        text = value.strip().lower()
        if self.contradicts_user_agent and claim is not None:
            return bool(text) and _contradicts(text, claim)
        if self.absent and not text:
            return True
        if self.equals and text in self.equals:
            return True
        return bool(self.lacks) and not any(token in text for token in self.lacks)


@dataclass(frozen=True, slots=True)
class BehaviourRule:
    """A pattern in a client's recent behaviour: every ``at_least`` and ``below`` bound must hold."""

    name: str
    weight: float
    scope: str
    at_least: tuple[tuple[int, float], ...]  # (field index, bound)
    below: tuple[tuple[int, float], ...]
    needs_site_assets: bool = False

    def fires(self, counts: list[float], site_has_assets: bool) -> bool:
        if self.needs_site_assets and not site_has_assets:
            return False
        return all(counts[field] >= bound for field, bound in self.at_least) and all(
            counts[field] < bound for field, bound in self.below
        )


@dataclass(frozen=True, slots=True)
class EvidenceRules:
    """The threshold, the one-request checks and the behaviour rules."""

    threshold: float
    checks: tuple[RequestCheck, ...]
    behaviours: tuple[BehaviourRule, ...]

    @property
    def headers(self) -> frozenset[bytes]:
        """The request headers the checks read."""
        return frozenset(check.header.encode() for check in self.checks)

    def check_request(
        self, claim: BrowserClaim | None, header: Callable[[str], str], *, secure: bool
    ) -> tuple[float, tuple[str, ...]]:
        """The weight of the checks ``claim``'s request fails, and their names; ``header(name)`` is its value."""
        weight = 0.0
        reasons: list[str] = []
        for check in self.checks:
            if check.applies(claim, secure) and check.fires(header(check.header), claim):
                weight += check.weight
                reasons.append(check.name)
        return weight, tuple(reasons)


def _contradicts(hints: str, claim: BrowserClaim) -> bool:
    """Whether a sec-ch-ua value names a browser or version the user agent does not."""
    if claim.name in ("firefox", "safari"):
        return True  # they never send client hints
    named = {(_HINT_BROWSERS[brand], int(version)) for brand, version in _HINT_BRAND.findall(hints)
             if brand in _HINT_BROWSERS}  # fmt: skip
    if not named:
        return False  # only GREASE brands: nothing to compare
    if claim.name == "edge":
        return ("edge", int(claim.version)) not in named
    return ("chrome", int(claim.version)) not in named


def load_evidence_rules(path: Path) -> EvidenceRules:
    """Read an evidence rules file; a broken one raises ConfigError naming the file and the entry."""
    data = read_toml(path, "Rules file", "evidence.rules_file")
    threshold = data.get("threshold", 3.0)
    if not isinstance(threshold, int | float) or isinstance(threshold, bool) or threshold <= 0:
        raise ConfigError(f"{path}: threshold must be a positive number, not {threshold!r}.")
    checks = tuple(_check(entry, f"{path}: [[check]] {number}") for number, entry in _entries(data, "check", path))
    behaviours = tuple(
        _behaviour(entry, f"{path}: [[behaviour]] {number}") for number, entry in _entries(data, "behaviour", path)
    )
    unknown = set(data) - {"threshold", "check", "behaviour"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; known: threshold, check, behaviour.")
    return EvidenceRules(float(threshold), checks, behaviours)


def _entries(data: dict[str, Any], table: str, path: Path) -> list[tuple[int, dict[str, Any]]]:
    entries = data.get(table, [])
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise ConfigError(f"{path}: '{table}' must be an array of tables ([[{table}]]).")
    return list(enumerate(entries, 1))


def _name_and_weight(entry: dict[str, Any], where: str) -> tuple[str, float]:
    name, weight = entry.get("name"), entry.get("weight")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise ConfigError(f"{where}: name must be lower-case words joined by '-', not {name!r}.")
    if not isinstance(weight, int | float) or isinstance(weight, bool) or weight <= 0:
        raise ConfigError(f"{where} ({name}): weight must be a positive number, not {weight!r}.")
    return name, float(weight)


def _check(entry: dict[str, Any], where: str) -> RequestCheck:
    name, weight = _name_and_weight(entry, where)
    where = f"{where} ({name})"
    known = {"name", "weight", "header", "absent", "equals", "lacks", "contradicts_user_agent", "secure_only", "since"}
    if set(entry) - known:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(set(entry) - known))}.")
    header = entry.get("header")
    if not isinstance(header, str) or not header:
        raise ConfigError(f"{where}: header must name a request header.")
    strings = {}
    for key in ("equals", "lacks"):
        values = entry.get(key, [])
        if not isinstance(values, list) or not all(isinstance(value, str) and value for value in values):
            raise ConfigError(f"{where}: {key} must be a list of non-empty strings.")
        strings[key] = tuple(value.strip().lower() for value in values)
    flags = {}
    for key in ("absent", "contradicts_user_agent", "secure_only"):
        if not isinstance(entry.get(key, False), bool):
            raise ConfigError(f"{where}: {key} must be true or false.")
        flags[key] = entry.get(key, False)
    if not (flags["absent"] or strings["equals"] or strings["lacks"] or flags["contradicts_user_agent"]):
        raise ConfigError(f"{where}: say when it fires: absent, equals, lacks or contradicts_user_agent.")
    since = entry.get("since")
    if since is not None:
        if not isinstance(since, dict) or not since or not set(since) <= set(BROWSERS):
            raise ConfigError(f"{where}: since must map browsers ({', '.join(BROWSERS)}) to their first version.")
        if not all(isinstance(version, int | float) and not isinstance(version, bool) for version in since.values()):
            raise ConfigError(f"{where}: since's versions must be numbers.")
    return RequestCheck(
        name=name,
        weight=weight,
        header=header.lower(),
        absent=flags["absent"],
        equals=strings["equals"],
        lacks=strings["lacks"],
        contradicts_user_agent=flags["contradicts_user_agent"],
        secure_only=flags["secure_only"],
        since={browser: float(version) for browser, version in since.items()} if since else None,
    )


def _behaviour(entry: dict[str, Any], where: str) -> BehaviourRule:
    name, weight = _name_and_weight(entry, where)
    where = f"{where} ({name})"
    scope = entry.get("scope", "address")
    if scope not in SCOPES:
        raise ConfigError(f"{where}: scope must be one of {', '.join(SCOPES)}, not {scope!r}.")
    at_least: list[tuple[int, float]] = []
    below: list[tuple[int, float]] = []
    for key, value in entry.items():
        if key in ("name", "weight", "scope", "needs_site_assets"):
            continue
        field, _, bound = key.rpartition("_at_least") if key.endswith("_at_least") else key.rpartition("_below")
        if field not in BEHAVIOUR_FIELDS or bound:
            raise ConfigError(
                f"{where}: unknown key '{key}'; conditions are <field>_at_least and <field>_below with a field "
                f"among {', '.join(BEHAVIOUR_FIELDS)}."
            )
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{where}: {key} must be a number of 0 or more, not {value!r}.")
        (at_least if key.endswith("_at_least") else below).append((BEHAVIOUR_FIELDS.index(field), float(value)))
    if not at_least and not below:
        raise ConfigError(f"{where}: give at least one condition (<field>_at_least or <field>_below).")
    needs_assets = entry.get("needs_site_assets", False)
    if not isinstance(needs_assets, bool):
        raise ConfigError(f"{where}: needs_site_assets must be true or false.")
    return BehaviourRule(name, weight, scope, tuple(at_least), tuple(below), needs_assets)
