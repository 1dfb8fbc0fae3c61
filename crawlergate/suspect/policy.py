"""The policy table (``rules/policy.toml``): what each class, tag and family of non-person gets.

policy = load_policy(Path("rules/policy.toml"))
policy.action_for(verdict)   # Action.CACHE
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

from crawlergate.errors import ConfigError
from crawlergate.metrics import SIGNED_AGENT, Classified
from crawlergate.rules import CRAWLER_TAGS, read_toml

CLASSES_WITH_POLICY = ("crawler", "suspect")
# The tags of suspects (crawlergate.suspect.judge): found by evidence, or claiming a crawler they are not.
SUSPECT_TAGS = ("evidence", "unverified-claimant")


class Action(enum.Enum):
    CACHE = "cache"  # serve from the cache, fill on a miss
    CACHE_ONLY = "cache-only"  # serve if stored, else 503 + Retry-After
    LIVE = "live"  # pass to the site
    DENY = "deny"  # 403


class Policy:
    """Actions by family, then tag, then class; people always get LIVE."""

    def __init__(
        self,
        classes: dict[str, Action] | None = None,
        tags: dict[str, Action] | None = None,
        families: dict[str, Action] | None = None,
    ) -> None:
        self.classes = {"crawler": Action.CACHE, "suspect": Action.CACHE} | (classes or {})
        self.tags = tags or {}
        self.families = families or {}
        self._memo: dict[tuple[str, str, str], Action] = {}

    def action_for(self, verdict: Classified) -> Action:
        key = (verdict.kind, verdict.family, verdict.tag)
        action = self._memo.get(key)
        if action is None:
            action = self._memo[key] = self._action(*key)
        return action

    def _action(self, kind: str, family: str, tag: str) -> Action:
        if kind not in CLASSES_WITH_POLICY:
            return Action.LIVE
        return self.families.get(family) or self.tags.get(tag) or self.classes.get(kind, Action.CACHE)

    @property
    def denies(self) -> bool:
        return Action.DENY in (*self.classes.values(), *self.tags.values(), *self.families.values())


def load_policy(path: Path, known_families: frozenset[str] = frozenset()) -> Policy:
    """Read a policy file; a broken one, or one naming a family the rules do not know, raises ConfigError."""
    data = read_toml(path, "Policy file", "policy.rules_file")
    unknown = set(data) - {"class", "tag", "family"}
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}; known: [class], [tag], [family].")
    classes = _actions(data, "class", path, CLASSES_WITH_POLICY)
    tags = _actions(data, "tag", path, (*CRAWLER_TAGS, *SUSPECT_TAGS, SIGNED_AGENT))
    families = _actions(data, "family", path, tuple(known_families) if known_families else None)
    return Policy(classes, tags, families)


def _actions(data: dict[str, Any], table: str, path: Path, names: tuple[str, ...] | None) -> dict[str, Action]:
    entries = data.get(table, {})
    if not isinstance(entries, dict):
        raise ConfigError(f"{path}: [{table}] must be a table of name = action.")
    actions: dict[str, Action] = {}
    choices = ", ".join(action.value for action in Action)
    for name, value in entries.items():
        if names is not None and name not in names:
            known = (
                ", ".join(sorted(names))
                if len(names) < 12
                else "the family names of rules/crawlers.toml and the operators of rules/agents.toml"
            )
            raise ConfigError(f"{path}: [{table}] '{name}' is not known; known: {known}.")
        try:
            actions[name] = Action(value)
        except ValueError:
            raise ConfigError(f"{path}: [{table}] {name} = {value!r}: the action must be one of {choices}.") from None
    return actions
