"""Who the tests send to the gate, in one place: crawlers, people with browsers, and suspects.

A crawler sends its user agent and little else (``GOOGLEBOT``). A person's browser sends the headers of a page
load with it (Accept, Accept-Language, Sec-Fetch-* …), which the gate's evidence rules (rules/evidence.toml)
look for: the people of the tests look like people to the gate, as those of the world do (``FIREFOX``). A suspect
claims a browser's user agent without those headers (``SUSPECT``). Where a test needs one exact variant (a phone,
an older browser, the shorter agents of the sample logs), it has its own name here and a comment saying why;
tests/test_test_helpers.py fails when another test module defines an agent or a visitor's headers at module
level.
"""

from __future__ import annotations

from collections.abc import Mapping

# ---- Crawlers: their user agents, as they send them ------------------------------------------------------------

GOOGLEBOT_UA = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
# Googlebot Smartphone: the crawler a site that serves phones their own page (Vary: User-Agent) sees.
GOOGLEBOT_SMARTPHONE_UA = (
    "Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.6778.204 Mobile Safari/537.36 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
)
BINGBOT_UA = "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)"
GPTBOT_UA = "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)"
BYTESPIDER_UA = "Mozilla/5.0 (Linux; Android 5.0) AppleWebKit/537.36 (compatible; Bytespider; spider@b.com)"
UPTIME_ROBOT_UA = "Mozilla/5.0+(compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)"
# Fetchers a person sets off (a feed reader, a chat app's link preview): crawlers by their user agent all the same.
FEED_READER_UA = "Miniflux/2.2.0 (+https://miniflux.app)"
LINK_PREVIEW_UAS = ("Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)", "facebookexternalhit/1.1")

# Crawlers without the "+URL" part, as some sample logs write them (tests/data/logs/formats): test_logformats.py
# compares parsed records with these exact strings (Bingbot's, Yandex's), and writes its own log lines with
# Googlebot's.
GOOGLEBOT_SHORT_UA = "Mozilla/5.0 (compatible; Googlebot/2.1)"
BINGBOT_SHORT_UA = "Mozilla/5.0 (compatible; bingbot/2.0)"
YANDEXBOT_SHORT_UA = "Mozilla/5.0 (compatible; YandexBot/3.0)"

# ---- Crawlers: the headers of their requests ---------------------------------------------------------------------

GOOGLEBOT = {"user-agent": GOOGLEBOT_UA}
GOOGLEBOT_SMARTPHONE = {"user-agent": GOOGLEBOT_SMARTPHONE_UA}
GPTBOT = {"user-agent": GPTBOT_UA}
BYTESPIDER = {"user-agent": BYTESPIDER_UA}
UPTIME_ROBOT = {"user-agent": UPTIME_ROBOT_UA}

# ---- Browsers: their user agents ---------------------------------------------------------------------------------

FIREFOX_UA = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"
CHROME_UA = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"
EDGE_UA = CHROME_UA + " Edg/131.0.0.0"
SAFARI_UA = (
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.6 Safari/605.1.15"
)
# Browsers from before fetch metadata (Sec-Fetch-*): Safari before 16.4, Internet Explorer.
OLD_SAFARI_UA = (
    "Mozilla/5.0 (iPhone; CPU iPhone OS 12_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/12.1.2 Mobile/15E148 Safari/604.1"
)
IE11_UA = "Mozilla/5.0 (Windows NT 10.0; WOW64; Trident/7.0; rv:11.0) like Gecko"
# Chrome on Windows: the person of the real-site tests (tests/sites), whose client hints name version 131.
CHROME_WINDOWS_UA = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"
)
# A current desktop Chrome, as scrapers copy it from their own browser (test_hidden_crawlers.py): a newer
# version than CHROME_UA's, with the full navigation of that version in CURRENT_CHROME below.
CURRENT_CHROME_UA = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/142.0.0.0 Safari/537.36"
)
# ChatGPT agent's user agent: a desktop Chrome's on a Mac (test_signed_agents.py: a signed agent that looks like
# a browser).
CHATGPT_AGENT_UA = (
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/138.0.0.0 Safari/537.36"
)

# ---- People: what each browser sends on a page load --------------------------------------------------------------

# Firefox's page load: the person of most tests.
FIREFOX = {
    "user-agent": FIREFOX_UA,
    "accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "accept-language": "en-US,en;q=0.5",
    "accept-encoding": "gzip, deflate",
    "sec-fetch-dest": "document",
    "sec-fetch-mode": "navigate",
    "sec-fetch-site": "none",
    "sec-fetch-user": "?1",
}
# Chrome's page load (with client hints), as a person of the real-site tests sends it.
CHROME = {
    "user-agent": CHROME_WINDOWS_UA,
    "accept": "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8",
    "accept-language": "en-GB,en;q=0.9",
    "accept-encoding": "gzip, deflate",
    "sec-ch-ua": '"Google Chrome";v="131", "Chromium";v="131", "Not_A Brand";v="24"',
    "sec-fetch-dest": "document",
    "sec-fetch-mode": "navigate",
    "sec-fetch-site": "none",
}
# Everything a current Chrome sends with a navigation, Upgrade-Insecure-Requests and the platform hints too.
CURRENT_CHROME = {
    "user-agent": CURRENT_CHROME_UA,
    "accept": "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,"
    "application/signed-exchange;v=b3;q=0.7",
    "accept-language": "en-GB,en;q=0.9",
    "accept-encoding": "gzip, deflate, br, zstd",
    "sec-ch-ua": '"Chromium";v="142", "Google Chrome";v="142", "Not_A Brand";v="99"',
    "sec-ch-ua-mobile": "?0",
    "sec-ch-ua-platform": '"Windows"',
    "upgrade-insecure-requests": "1",
    "sec-fetch-site": "none",
    "sec-fetch-mode": "navigate",
    "sec-fetch-user": "?1",
    "sec-fetch-dest": "document",
}

# The navigation headers alone, without a user agent, as measured (rules/evidence.toml lists them): the evidence
# tests (test_suspect.py) pair them with the user agents above. They differ from FIREFOX's and CHROME's (Accept-Encoding
# with br and zstd; no Sec-Fetch-Site): the evidence tests were written against these exact sets.
CHROME_NAVIGATION = {
    "accept": "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8",
    "accept-language": "en-GB,en;q=0.9",
    "accept-encoding": "gzip, deflate, br, zstd",
    "sec-fetch-mode": "navigate",
    "sec-fetch-dest": "document",
    "sec-ch-ua": '"Google Chrome";v="131", "Chromium";v="131", "Not_A Brand";v="24"',
}
FIREFOX_NAVIGATION = {
    "accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "accept-language": "en-US,en;q=0.5",
    "accept-encoding": "gzip, deflate, br, zstd",
    "sec-fetch-mode": "navigate",
    "sec-fetch-dest": "document",
}
OLD_BROWSER_NAVIGATION = {  # before fetch metadata (Safari before 16.4, Internet Explorer)
    "accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "accept-language": "en-us",
    "accept-encoding": "gzip, deflate",
}

# ---- Suspects: a browser's user agent without a browser's headers ------------------------------------------------

# curl with Chrome's user agent: the claim of a browser, the headers of a script.
SUSPECT = {"user-agent": CHROME_UA, "accept": "*/*"}
# What scripted clients send besides a user agent, by client (as measured; rules/evidence.toml): each one with a
# browser's user agent is a suspect.
SCRIPTED = {
    "curl": {"accept": "*/*"},
    "urllib": {"accept-encoding": "identity"},
    "httpx": {"accept": "*/*", "accept-encoding": "gzip, deflate, br, zstd"},
    "aiohttp": {"accept": "*/*", "accept-encoding": "gzip, deflate, br"},
    "requests": {"accept": "*/*", "accept-encoding": "gzip, deflate"},
    "go": {"accept-encoding": "gzip"},
    "wget": {"accept": "*/*", "accept-encoding": "identity"},
    "node-fetch": {"accept": "*/*", "accept-language": "*", "accept-encoding": "gzip, deflate"},
}


# ---- The same headers in the forms other interfaces take ---------------------------------------------------------


def header_lines(headers: Mapping[str, str]) -> bytes:
    """``headers`` as the header lines of a request written on a raw socket (each ending in CRLF)."""
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode()


def raw_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """``headers`` as ASGI's raw header pairs: (name, value) in bytes."""
    return [(name.encode(), value.encode()) for name, value in headers.items()]


FIREFOX_LINES = header_lines(FIREFOX)
GOOGLEBOT_LINES = header_lines(GOOGLEBOT)
