"""Take the documentation's screenshots in the headless Chromium the browser tests use (tests/browser.py).

Starts ``crawlergate demo --serve`` on loopback (the demo forum, crawlergate in front of it, L2
warmed, the demo's trace replayed straight to the forum and through the gate; ``report.html``),
sends a minute of crawler and person traffic through the gate (a person with a browser's full
navigation headers, a few scripts behind a browser's user agent without them: suspects), and saves
into ``docs/img/``, each about 1280 px wide:

* ``dashboard.png``: ``/_crawlergate/`` of the running gate;
* ``demo-report.png``: the top of the demo's ``report.html``;
* ``analyze-report.png``, ``simulate-report.png``: the tops of ``analyze --report`` and
  ``simulate --report`` on ``examples/access.log``.

Then it stops the demo (SIGTERM, which stops the forum and the gate with it). Run from the
repository root, with Chromium and chromedriver installed (``apt-get install chromium
chromium-driver``)::

    python scripts/screenshots.py [--out docs/img] [--seconds 60]
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from benchlib import CHROME, GOOGLEBOT, PERSON

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.browser import CHROMEDRIVER, CHROMIUM, chromium  # noqa: E402

CRAWLER_AGENTS = (
    GOOGLEBOT,
    GOOGLEBOT,
    "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm) "
    "Chrome/116.0.1938.76 Safari/537.36",
    "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)",
    "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; ClaudeBot/1.0; +claudebot@anthropic.com)",
    "Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)",
)
SERVING = re.compile(r"the gate on (http://127\.0\.0\.1:\d+),")
THREADS = 1000  # the demo's default forum
WIDTH = 1280


def start_demo(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``crawlergate demo --serve`` in its own folder; returns the process and the gate's address once it serves."""
    out, err = (folder / "demo.out").open("wb"), (folder / "demo.err").open("wb")
    command = [sys.executable, "-m", "crawlergate", "demo", "--serve", "--dir", str(folder / "demo")]
    process = subprocess.Popen(command, stdout=out, stderr=err, cwd=ROOT)
    print("running the demo (about two minutes)...", flush=True)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        found = SERVING.search((folder / "demo.err").read_text(encoding="utf-8", errors="replace"))
        if found:
            return process, found.group(1)
        if process.poll() is not None:
            raise SystemExit(f"the demo stopped (exit {process.returncode}): see {folder / 'demo.err'}")
        time.sleep(1)
    stop(process)
    raise SystemExit("the demo did not start serving in 15 minutes")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def send_traffic(gate: str, seconds: float, rng: random.Random) -> None:
    """Crawlers over the forum's threads (hits, and misses on pages at URLs the warming did not use), people
    reading popular threads with a browser's navigation headers, now and then a script posing as Chrome."""
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=gate, timeout=30) as client:
        while time.monotonic() < deadline:
            for _ in range(rng.randrange(2, 7)):
                thread = rng.randrange(1, THREADS + 1)
                path = f"/showthread.php?t={thread}" if rng.random() < 0.8 else f"/t/{thread}"
                client.get(path, headers={"User-Agent": rng.choice(CRAWLER_AGENTS)})
            for _ in range(rng.randrange(0, 3)):
                client.get(f"/showthread.php?t={rng.randrange(1, 40)}", headers=PERSON)
            if rng.random() < 0.1:
                client.get(f"/showthread.php?t={rng.randrange(1, THREADS + 1)}", headers={"User-Agent": CHROME})
            time.sleep(rng.uniform(0.2, 0.6))


def shoot(driver: Any, url: str, path: Path, height: int) -> None:
    driver.set_window_size(WIDTH, height)
    driver.get(url)
    driver.find_element("css selector", "h1")
    time.sleep(1.0)  # the charts draw after the page loads
    driver.save_screenshot(str(path))
    print(f"{path}: {path.stat().st_size / 1024:,.0f} KB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the PNGs go")
    parser.add_argument("--seconds", type=float, default=60, help="traffic sent before the dashboard is taken")
    args = parser.parse_args()
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        raise SystemExit("Chromium and chromedriver are needed: apt-get install chromium chromium-driver")
    args.out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="crawlergate-screenshots-"))
    sample = ROOT / "examples" / "access.log"
    for command in ("analyze", "simulate"):
        report = folder / f"{command}.html"
        subprocess.run(
            [sys.executable, "-m", "crawlergate", command, str(sample), "--report", str(report)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    process, gate = start_demo(folder)
    try:
        print(f"sending {args.seconds:g} s of crawler and person traffic to {gate}", flush=True)
        send_traffic(gate, args.seconds, random.Random(2012))
        with chromium(WIDTH, 900) as browser:
            from selenium.webdriver.support.wait import WebDriverWait

            driver: Any = browser  # tests.browser yields it untyped
            driver.set_window_size(WIDTH, 1500)
            driver.get(f"{gate}/_crawlergate/")
            wait = WebDriverWait(driver, 30, poll_frequency=0.5)
            wait.until(lambda d: len(d.find_elements("css selector", "#chart-rate .uplot canvas")) == 1)
            time.sleep(2.5)  # one more refresh: every figure filled in
            driver.save_screenshot(str(args.out / "dashboard.png"))
            print(f"{args.out / 'dashboard.png'}: {(args.out / 'dashboard.png').stat().st_size / 1024:,.0f} KB")
            shoot(driver, (folder / "demo" / "report.html").as_uri(), args.out / "demo-report.png", 1000)
            shoot(driver, (folder / "analyze.html").as_uri(), args.out / "analyze-report.png", 900)
            shoot(driver, (folder / "simulate.html").as_uri(), args.out / "simulate-report.png", 900)
    finally:
        stop(process)
    print(f"the demo's files: {folder}")


if __name__ == "__main__":
    main()
