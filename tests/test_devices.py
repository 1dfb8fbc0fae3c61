"""Device classes (rules/devices.toml): the class of a user agent for pages that vary by device, and a broken rules
file reported as one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawlergate.devices import load_device_classes
from crawlergate.errors import ConfigError
from crawlergate.rules import default_rules_dir

DEVICES = load_device_classes(default_rules_dir() / "devices.toml")


@pytest.mark.parametrize(
    ("user_agent", "device"),
    [
        pytest.param(
            "Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36 (KHTML, like Gecko) "
            "Chrome/131.0.6778.204 Mobile Safari/537.36 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
            "mobile",
            id="googlebot-smartphone",
        ),
        pytest.param("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", None, id="googlebot"),
        pytest.param(
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
            "Version/17.0 Mobile/15E148 Safari/604.1 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
            "mobile",
            id="bingbot-mobile",
        ),
        pytest.param(
            "Mozilla/5.0 (iPad; CPU OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
            "Version/17.0 Mobile/15E148 Safari/604.1",
            None,
            id="ipad-is-desktop",
        ),
        pytest.param(
            "Mozilla/5.0 (Linux; Android 13; SM-X700) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120 Safari/537.36",
            None,
            id="android-tablet-is-desktop",
        ),
        pytest.param("", None, id="none"),
    ],
)
def test_devices_class_of_a_user_agent(user_agent: str, device: str | None) -> None:
    found = DEVICES.of(user_agent.encode())
    assert (found.name if found else None) == device


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param('[[device]]\nname = "desktop"\ntokens = ["x"]\nfill_user_agent = "x"', "other than 'desktop'"),
        pytest.param('[[device]]\nname = "tv"\ntokens = "smart-tv"\nfill_user_agent = "x"', "list of non-empty"),
        pytest.param('[[device]]\nname = "tv"\ntokens = ["tv"]', "fill_user_agent must be"),
        pytest.param('[[devices]]\nname = "tv"', "unknown key"),
    ],
)
def test_devices_broken_rules_are_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "devices.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_device_classes(path)
