"""The published address ranges of search-engine crawlers (``rules/search-engine-ranges.toml``).

A claimed Googlebot is believed from Google's prefixes only. The file lists, per family, its
prefixes, the suffixes its reverse DNS names end in, and where the list is published, so
``crawlergate ranges`` can refresh it (``read_published`` parses both published shapes: Google's
JSON, also used by Bing, Apple and OpenAI, and text with an address or prefix per line).

    ranges = load_ranges(default_ranges_file())
    ranges.verify("Googlebot", "66.249.66.1")   # True; None for a family nobody can verify
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from crawlergate.errors import ConfigError
from crawlergate.rules import default_rules_dir, read_toml

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# Answers remembered per (family, address): parsing an address costs more than the rest of a hit.
_KNOWN = 8192
# A published list is tens of kilobytes with hundreds of prefixes; past these it is something else.
MAX_PREFIXES = 10_000
MAX_LIST_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Engine:
    """One family's published crawler addresses."""

    family: str
    prefixes: tuple[Network, ...]
    reverse_dns: tuple[str, ...] = ()
    source: str = ""


class CrawlerRanges:
    """Which families can be verified, and whether an address is one of a family's."""

    def __init__(self, engines: Iterable[Engine], snapshot: str = "") -> None:
        self.engines = {engine.family: engine for engine in engines}
        self.snapshot = snapshot
        self._known: dict[tuple[str, str], bool] = {}

    def verifiable(self, family: str, *, by_dns: bool = False) -> bool:
        """Whether a claim to be ``family`` can be checked: it publishes prefixes, or DNS names with ``by_dns``."""
        engine = self.engines.get(family)
        return engine is not None and bool(engine.prefixes or (by_dns and engine.reverse_dns))

    def verify(self, family: str, address: str | None) -> bool | None:
        """True when ``address`` is in ``family``'s prefixes (or is this machine), False when not, None when the
        family publishes none."""
        engine = self.engines.get(family)
        if engine is None or not engine.prefixes:
            return None
        if address is None:
            return False
        known = self._known.get((family, address))
        if known is None:
            if len(self._known) >= _KNOWN:
                self._known.clear()
            known = self._known[(family, address)] = _within(address, engine.prefixes)
        return known

    def dns_suffixes(self, family: str) -> tuple[str, ...]:
        engine = self.engines.get(family)
        return engine.reverse_dns if engine is not None else ()


def _within(address: str, prefixes: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.removeprefix("::ffff:") if "." in address else address)
    except ValueError:
        return False
    if ip.is_loopback:
        return True  # this machine: the operator's own warmers, monitors and tests
    return any(ip.version == network.version and ip in network for network in prefixes)


def default_ranges_file() -> Path:
    return default_rules_dir() / "search-engine-ranges.toml"


def load_ranges(path: Path) -> CrawlerRanges:
    """Read a ranges file; a broken one raises ConfigError naming the file and the family."""
    data = read_toml(path, "Ranges file", "verify.ranges_file")
    entries = data.get("engine", [])
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise ConfigError(f"{path}: 'engine' must be an array of tables ([[engine]]).")
    return CrawlerRanges((_engine(entry, path) for entry in entries), snapshot=str(data.get("snapshot", "")))


def _engine(entry: dict[str, Any], path: Path) -> Engine:
    family = entry.get("family")
    if not isinstance(family, str) or not family:
        raise ConfigError(f"{path}: every [[engine]] needs a family (a family name of rules/crawlers.toml).")
    prefixes = entry.get("prefixes", [])
    suffixes = entry.get("reverse_dns", [])
    for key, values in (("prefixes", prefixes), ("reverse_dns", suffixes)):
        if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
            raise ConfigError(f"{path}: {family}: {key} must be a list of strings.")
    try:
        networks = tuple(ipaddress.ip_network(prefix, strict=False) for prefix in prefixes)
    except ValueError as exc:
        raise ConfigError(f"{path}: {family}: {exc}.") from None
    source = entry.get("source", "")
    if not isinstance(source, str):
        raise ConfigError(f"{path}: {family}: source must be a URL or a file path.")
    return Engine(family, networks, tuple(suffix.lower().strip(".") for suffix in suffixes), source)


def read_published(text: str, origin: str) -> tuple[Network, ...]:
    """The prefixes of a published list: Google's JSON shape, or one address or prefix per line (``#`` comments).

    Raises ConfigError naming ``origin`` when nothing in it is a prefix.
    """
    prefixes: list[str] = []
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{origin}: not valid JSON: {exc}.") from None
        items = data.get("prefixes", []) if isinstance(data, dict) else data
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict):
                prefixes.extend(str(value) for key, value in item.items() if key in ("ipv4Prefix", "ipv6Prefix"))
            elif isinstance(item, str):
                prefixes.append(item)
    else:
        for line in text.splitlines():
            word = line.split("#", 1)[0].strip()
            if word:
                prefixes.append(word)
    if len(prefixes) > MAX_PREFIXES:
        raise ConfigError(
            f"{origin}: {len(prefixes):,} prefixes; a crawler's list has hundreds (at most {MAX_PREFIXES:,})."
        )
    networks: list[Network] = []
    for prefix in prefixes:
        try:
            network = ipaddress.ip_network(prefix, strict=False)
        except ValueError:
            raise ConfigError(f"{origin}: {prefix!r} is not an address or prefix.") from None
        if network.prefixlen < (8 if network.version == 4 else 19) or not network.is_global:
            raise ConfigError(f"{origin}: {prefix!r} is no crawler's: too wide, or a private or reserved network.")
        networks.append(network)
    if not networks:
        raise ConfigError(f'{origin}: no address prefix in it (expected {{"prefixes": [...]}} or one per line).')
    return tuple(networks)


def with_prefixes(ranges: CrawlerRanges, family: str, prefixes: tuple[Network, ...], source: str) -> CrawlerRanges:
    """``ranges`` with ``family``'s prefixes replaced (the family added when new, with ``source``; a known family
    keeps the source it publishes at, whatever copy was read)."""
    engines = dict(ranges.engines)
    old = engines.get(family)
    engines[family] = (
        replace(old, prefixes=prefixes, source=old.source or source)
        if old is not None
        else Engine(family, prefixes, (), source)
    )
    return CrawlerRanges(engines.values(), snapshot=ranges.snapshot)


def ranges_text(ranges: CrawlerRanges, snapshot: str) -> str:
    """A ranges file for ``ranges``, dated ``snapshot``."""
    lines = [
        "# Search-engine crawler addresses, written by `crawlergate ranges` (see rules/search-engine-ranges.toml).",
        "",
        f"snapshot = {json.dumps(snapshot)}",
    ]
    for engine in ranges.engines.values():
        lines += ["", "[[engine]]", f"family = {json.dumps(engine.family)}"]
        if engine.source:
            lines.append(f"source = {json.dumps(engine.source)}")
        lines.append(f"reverse_dns = {json.dumps(list(engine.reverse_dns))}")
        lines.append(f"prefixes = {json.dumps([str(prefix) for prefix in engine.prefixes])}")
    return "\n".join(lines) + "\n"


def fetch_published(source: str, timeout_s: float = 30.0) -> str:
    """The text of a published list: an http(s) URL, or a file; raises ConfigError naming what failed."""
    if source.startswith(("http://", "https://")):
        import httpx

        try:
            with httpx.stream("GET", source, timeout=timeout_s, follow_redirects=True) as answer:
                if answer.status_code != 200:
                    raise ConfigError(f"{source}: answered {answer.status_code}.")
                data = bytearray()
                for chunk in answer.iter_bytes():
                    data += chunk
                    if len(data) > MAX_LIST_BYTES:
                        raise ConfigError(f"{source}: larger than {MAX_LIST_BYTES // 1024 // 1024} MB: not a list.")
        except httpx.HTTPError as exc:
            raise ConfigError(f"{source}: cannot be fetched: {exc or type(exc).__name__}.") from None
        return data.decode("utf-8", "replace")
    try:
        with open(source, "rb") as file:
            contents = file.read(MAX_LIST_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot be read: {exc.strerror or exc}.") from None
    if len(contents) > MAX_LIST_BYTES:
        raise ConfigError(f"{source}: larger than {MAX_LIST_BYTES // 1024 // 1024} MB: not a list.")
    return contents.decode("utf-8", "replace")
