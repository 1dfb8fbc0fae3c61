"""Headless Chromium for the tests that look at pages as a person would (Debian's chromium and chromium-driver).

Selenium is pointed at /usr/bin/chromedriver, so Selenium Manager never tries to download a browser (these
machines reach no such host). Screenshots go to ``SCREENSHOT_DIR`` (``CRAWLERGATE_SCREENSHOTS`` or
``.pytest-screenshots``), kept as CI artifacts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOT_DIR = Path(os.environ.get("CRAWLERGATE_SCREENSHOTS", Path(__file__).parent.parent / ".pytest-screenshots"))
# A laptop screen: what a report or the dashboard must fit without scrolling sideways.
WINDOW = (1280, 900)


@contextmanager
def chromium(width: int = WINDOW[0], height: int = WINDOW[1]) -> Iterator[object]:
    """A headless Chromium driven by Selenium; fails (never skips) in CI when the browser is missing."""
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
