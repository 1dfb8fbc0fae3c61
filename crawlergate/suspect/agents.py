"""The operators whose signed agents the gate verifies (``rules/agents.toml``): name and origin of each.

A signed request names its operator's origin (``Signature-Agent``); the gate fetches that origin's key
directory only when the origin is listed here, so a client cannot make the gate fetch what it likes.

    operators = load_operators(Path("rules/agents.toml"))
    operators.name_of("https://chatgpt.com")   # "ChatGPT agent"
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from crawlergate.errors import ConfigError
from crawlergate.rules import read_toml

# What a family name may hold: it is a counter label, a policy key and an access-log field.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()-]{0,63}")


@dataclass(frozen=True, slots=True)
class Operators:
    """Operator names by origin (``scheme://host[:port]``, lower-case, no path)."""

    by_origin: dict[str, str]

    def name_of(self, origin: str) -> str | None:
        return self.by_origin.get(origin)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.by_origin.values())


def load_operators(path: Path) -> Operators:
    """Read an operators file; a broken one raises ConfigError naming the entry."""
    data = read_toml(path, "Agents file", "verify.agents_file")
    unknown = set(data) - {"operator"}
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}; known: [[operator]].")
    entries = data.get("operator", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: [[operator]] must be an array of tables with name and origin.")
    by_origin: dict[str, str] = {}
    for number, entry in enumerate(entries, 1):
        where = f"{path}: operator {number}"
        if not isinstance(entry, dict) or set(entry) - {"name", "origin", "note"}:
            raise ConfigError(f"{where}: give name, origin and (optionally) note, nothing else.")
        name, origin = entry.get("name"), entry.get("origin")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigError(f"{where}: name {name!r} must be 1 to 64 letters, digits, spaces or ._()-.")
        if not isinstance(origin, str):
            raise ConfigError(f'{where}: origin must be a string such as "https://agent.example".')
        normal = origin_of(origin)
        if normal is None:
            raise ConfigError(
                f"{where}: origin {origin!r} must be https://host[:port] without a path "
                "(http:// only for a loopback address, to try it on one machine)."
            )
        if normal in by_origin:
            raise ConfigError(f"{where}: origin {normal} is listed twice.")
        by_origin[normal] = name
    return Operators(by_origin)


def origin_of(url: str) -> str | None:
    """``url`` as an origin the gate may fetch a key directory from, or None: https with a host and nothing after
    it, or http on a loopback address."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    if not host or parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        return None
    if parts.scheme == "http" and not _is_loopback(host):
        return None
    if parts.scheme not in ("https", "http"):
        return None
    name = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{name}" + (f":{port}" if port is not None else "")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
