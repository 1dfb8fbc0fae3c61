"""Policy entries from a site's own robots.txt: the crawler families it shuts out of the whole site.

A group whose ``Disallow: /`` (with no ``Allow``) covers the whole site, for a user agent
token the rules know (``GPTBot`` names the OpenAI family), becomes ``deny`` for that family.
Groups for ``*`` and partial disallows are left alone: the cache serves those crawlers well.

    print(policy_from_robots(Path("robots.txt").read_text(), classifier))
"""

from __future__ import annotations

import json

from crawlergate.classify import Classifier
from crawlergate.errors import ConfigError


def families_shut_out(robots_txt: str, classifier: Classifier) -> dict[str, list[str]]:
    """Family name -> the robots.txt user agent tokens of the groups that disallow it the whole site."""
    groups = _groups(robots_txt)
    if not groups:
        raise ConfigError("no 'User-agent:' line in it: not a robots.txt.")
    denied: dict[str, list[str]] = {}
    for agents, rules in groups:
        whole_site = ("disallow", "/") in rules and not any(field == "allow" and value for field, value in rules)
        if not whole_site:
            continue
        for agent in agents:
            if agent == "*":
                continue
            verdict = classifier.classify(agent)
            if not verdict.is_crawler:
                verdict = classifier.classify(f"Mozilla/5.0 (compatible; {agent}/1.0)")
            if verdict.is_crawler and verdict.family not in ("", "unknown"):
                denied.setdefault(verdict.family, []).append(agent)
    return denied


def policy_from_robots(robots_txt: str, classifier: Classifier) -> str:
    """A [family] table of ``deny`` entries for rules/policy.toml."""
    denied = families_shut_out(robots_txt, classifier)
    lines = ["# From robots.txt: the families it disallows the whole site (crawlergate policy --robots).", "[family]"]
    for family, agents in sorted(denied.items()):
        lines.append(f'{json.dumps(family)} = "deny"  # {", ".join(agents)}')
    return "\n".join(lines) + "\n"


def _groups(text: str) -> list[tuple[list[str], list[tuple[str, str]]]]:
    """robots.txt's groups (RFC 9309): consecutive user-agent lines, then their rules."""
    groups: list[tuple[list[str], list[tuple[str, str]]]] = []
    agents: list[str] = []
    rules: list[tuple[str, str]] = []
    for line in text.splitlines():
        field, _, value = line.split("#", 1)[0].partition(":")
        field, value = field.strip().lower(), value.strip()
        if field == "user-agent":
            if rules:
                groups.append((agents, rules))
                agents, rules = [], []
            agents.append(value)
        elif field in ("allow", "disallow") and agents:
            rules.append((field, value))
    if agents:
        groups.append((agents, rules))
    return groups
