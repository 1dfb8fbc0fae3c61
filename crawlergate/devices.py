"""Device classes from user agents, for pages that vary by ``User-Agent`` (rules/devices.toml).

A site that serves phones their own page at the same URL says so with ``Vary: User-Agent``. For such
pages alone the cache keeps one copy per device class: the desktop copy under the page's own key, and
each other class's under a variant key whose target ends in ``#class`` (a fragment: never sent, so the
fill asks for the same URL, with the class's user agent). Marking a page changed marks its variants.

    devices = load_device_classes(Path("rules/devices.toml"))
    devices.of(b"Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X ...) ... Mobile Safari/537.36 (compatible; Googlebot/2.1")
    # DeviceClass(name='mobile', ...)
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from crawlergate.errors import ConfigError
from crawlergate.keys import CacheKey, digest_of
from crawlergate.rules import read_toml

DEVICES_FILE = "devices.toml"
_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """A class of devices: the tokens that name it in a user agent, and the user agent its fills send."""

    name: str
    tokens: tuple[str, ...]
    unless: tuple[str, ...]
    fill_user_agent: str


class DeviceClasses:
    """The device classes of the rules; a user agent of none of them is desktop (``of`` gives None)."""

    def __init__(self, classes: tuple[DeviceClass, ...]) -> None:
        self.classes = classes
        self._by_name = {device.name: device for device in classes}
        self.of = functools.lru_cache(maxsize=4096)(self._of)

    def named(self, name: str) -> DeviceClass | None:
        return self._by_name.get(name)

    def _of(self, user_agent: bytes) -> DeviceClass | None:
        text = user_agent.decode("latin-1").lower()
        for device in self.classes:
            if any(token in text for token in device.tokens) and not any(token in text for token in device.unless):
                return device
        return None


def load_device_classes(path: Path) -> DeviceClasses:
    """Read a device rules file; a broken one raises ConfigError naming the file and the entry."""
    data = read_toml(path, "Rules file")
    unknown = set(data) - {"device"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; known: device.")
    entries = data.get("device", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: 'device' must be a list of [[device]] tables.")
    classes = []
    for number, entry in enumerate(entries, 1):
        where = f"{path}: [[device]] {number}"
        if not isinstance(entry, dict) or set(entry) - {"name", "tokens", "unless", "fill_user_agent"}:
            raise ConfigError(f"{where}: keys are name, tokens, unless and fill_user_agent.")
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name == "desktop":
            raise ConfigError(f"{where}: name must be a short lower-case word other than 'desktop', not {name!r}.")
        tokens, unless = entry.get("tokens"), entry.get("unless", [])
        for field, value in (("tokens", tokens), ("unless", unless)):
            if not isinstance(value, list) or not all(isinstance(token, str) and token for token in value):
                raise ConfigError(f"{where}: {field} must be a list of non-empty strings.")
        agent = entry.get("fill_user_agent")
        if not isinstance(agent, str) or not agent.strip() or not agent.isascii():
            raise ConfigError(f"{where}: fill_user_agent must be a user agent string.")
        assert isinstance(tokens, list) and isinstance(unless, list)
        classes.append(
            DeviceClass(name, tuple(t.lower() for t in tokens), tuple(t.lower() for t in unless), agent.strip())
        )
    return DeviceClasses(tuple(classes))


def variant_key(key: CacheKey, device: DeviceClass) -> CacheKey:
    """The key of ``device``'s copy of a page that varies by user agent: its target with a ``#class`` fragment."""
    target = f"{key.target}#{device.name}"
    return CacheKey(target=target, digest=digest_of(target))


def varies_by_user_agent(headers: tuple[tuple[str, str], ...]) -> bool:
    """Whether a stored page's kept headers say its site serves each device its own page."""
    return any(name == "vary" and "user-agent" in value.lower() for name, value in headers)
