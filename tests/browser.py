"""Headless Chromium for the tests that look at pages as a person would (Debian's chromium and chromium-driver).

Selenium is pointed at /usr/bin/chromedriver, so Selenium Manager never tries to download a browser (these
machines reach no such host). Screenshots go to ``SCREENSHOT_DIR`` (``CRAWLERGATE_SCREENSHOTS`` or
``.pytest-screenshots``), kept as CI artifacts.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOT_DIR = Path(os.environ.get("CRAWLERGATE_SCREENSHOTS", Path(__file__).parent.parent / ".pytest-screenshots"))
# A laptop screen: what a report or the dashboard must fit without scrolling sideways.
WINDOW = (1280, 900)


@contextmanager
def chromium(width: int = WINDOW[0], height: int = WINDOW[1], *, performance_log: bool = False) -> Iterator[object]:
    """A headless Chromium driven by Selenium; fails (never skips) in CI when the browser is missing.

    ``performance_log`` records the DevTools network events, read back by ``network_responses``.
    """
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        if os.environ.get("CI"):
            pytest.fail("Chromium and chromedriver are needed (apt-get install chromium chromium-driver)")
        pytest.skip("Chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="crawlergate-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # Without the background-networking flags Chromium keeps dialling hosts this closed network refuses.
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", f"--window-size={width},{height}",
    ):  # fmt: skip
        options.add_argument(flag)
    if performance_log:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: object, name: str) -> Path:
    """Save the window as ``SCREENSHOT_DIR/name.png`` and return the path."""
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / f"{name}.png"
    driver.save_screenshot(str(path))  # type: ignore[attr-defined]
    return path


def has_horizontal_scroll(driver: object) -> bool:
    return bool(
        driver.execute_script(  # type: ignore[attr-defined]
            "return document.documentElement.scrollWidth > document.documentElement.clientWidth"
        )
    )


def present_as_chrome(driver: object) -> str:
    """Make the browser say it is the desktop Chrome of its own version, as a person's would; returns the user agent.

    Headless Chromium names itself ``HeadlessChrome``, which no person's browser does. The override
    (DevTools ``Network.setUserAgentOverride``) also sets the client hints (``sec-ch-ua``…) to agree
    with the user agent, so nothing in a single request tells it from a person's Chrome.
    """
    version = driver.capabilities["browserVersion"]  # type: ignore[attr-defined]
    major = version.split(".")[0]
    user_agent = (
        f"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/{major}.0.0.0 Safari/537.36"
    )
    brands = [{"brand": "Google Chrome", "version": major}, {"brand": "Chromium", "version": major},
              {"brand": "Not_A Brand", "version": "24"}]  # fmt: skip
    metadata = {
        "brands": brands,
        "fullVersionList": [
            {**brand, "version": version if brand["version"] == major else "24.0.0.0"} for brand in brands
        ],  # fmt: skip
        "fullVersion": version,
        "platform": "Linux",
        "platformVersion": "6.1.0",
        "architecture": "x86",
        "model": "",
        "mobile": False,
        "bitness": "64",
    }
    override = {"userAgent": user_agent, "acceptLanguage": "en-US,en", "platform": "Linux x86_64"}
    driver.execute_cdp_cmd("Network.setUserAgentOverride", {**override, "userAgentMetadata": metadata})  # type: ignore[attr-defined]
    return user_agent


@dataclass(frozen=True, slots=True)
class NetworkResponse:
    """One response the browser received (a redirect too), from its DevTools performance log."""

    url: str
    status: int
    headers: dict[str, str]  # names in lower case
    resource: str  # DevTools' resource type: Document, Stylesheet, Image, Fetch… ("" for a redirect)


def network_responses(driver: object) -> list[NetworkResponse]:
    """The responses received since the last call (needs ``chromium(performance_log=True)``), in order."""
    responses = []
    for entry in driver.get_log("performance"):  # type: ignore[attr-defined]
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.responseReceived":
            response, resource = params["response"], params.get("type", "")
        elif message["method"] == "Network.requestWillBeSent" and "redirectResponse" in params:
            response, resource = params["redirectResponse"], ""
        else:
            continue
        if response["url"].startswith(("http://", "https://")):
            headers = {name.lower(): value for name, value in response["headers"].items()}
            responses.append(NetworkResponse(response["url"], int(response["status"]), headers, resource))
    return responses
