"""End to end with PHP applications from Debian's packages behind ``crawlergate serve``.

MediaWiki (SQLite) and WordPress (MariaDB), each served by PHP's built-in server (``php -S``) and by
php-fpm behind nginx, and DokuWiki by ``php -S``: every set-up in a temporary folder of its own, on free
loopback ports (``tests/sites/php_sites.py``), with ``crawlergate serve --site PROFILE`` in front. For
each: Googlebot crawls at least 100 pages twice and the second pass comes from the cache (pages the
profile excludes are not crawled); a person logs in, changes a page (a MediaWiki edit, a WordPress
comment, a DokuWiki edit) and logs out through the gate; the change is marked (MediaWiki's PURGE and
the profiles' write rules), crawlers
keep the stored copy until ``crawlergate regenerate`` fetches it again, and then get the new page.

The applications come from ``scripts/install-php-sites`` (CI runs it); without them every test here
is skipped with the packages it lacks.
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import httpx
import pytest

from crawlergate.config import CacheSettings, Settings
from crawlergate.keys import KeyMaker
from tests.sites import php_sites
from tests.sites.crawl import HITS, Crawl, crawl, no_cookies_client
from tests.sites.people import Person
from tests.sites.processes import Service, run
from tests.visitors import GOOGLEBOT

pytestmark = pytest.mark.e2e

MIN_PAGES = 100
MIN_HIT_PERCENT = 95.0
ADMIN_TOKEN = "php-sites-test-token"
SETUPS = ["mediawiki-builtin", "mediawiki-fpm", "wordpress-builtin", "wordpress-fpm", "dokuwiki-builtin"]


@dataclass
class Gated:
    """A PHP site with ``crawlergate serve`` in front, on the port the site was told is public."""

    app: php_sites.PhpSite
    gate: Service
    cache_dir: Path

    @property
    def name(self) -> str:
        return self.app.name

    @property
    def gate_url(self) -> str:
        return self.gate.url

    def logs(self) -> str:
        return f"{self.app.logs()}\n--- {self.gate.name}:\n{self.gate.log_tail(3000)}"

    def gate_flags(self) -> list[str]:
        return gate_flags(self.app, self.cache_dir)

    def marked(self) -> list[tuple[str, str]]:
        """The pages the page catalogue holds as changed, with why."""
        uri = f"file:{self.cache_dir / 'dirty.sqlite3'}?mode=ro"
        with sqlite3.connect(uri, uri=True, timeout=5) as db:
            rows = db.execute("SELECT target, reason FROM pages WHERE dirty_since IS NOT NULL ORDER BY target")
            return [(str(target), str(reason)) for target, reason in rows]


def gate_flags(app: php_sites.PhpSite, cache_dir: Path) -> list[str]:
    """``serve``'s settings flags, which ``regenerate`` takes too."""
    flags = ["--origin", app.origin_url, "--public-url", app.public_url, "--cache-dir", str(cache_dir)]
    return flags + (["--site", app.profile] if app.profile else [])


def _healthz(client: httpx.Client) -> bool:
    return client.get("/_crawlergate/healthz").status_code == 200


@pytest.fixture(scope="module", params=SETUPS)
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gated]:
    kind, server = request.param.split("-")
    reason = php_sites.missing(kind, server)
    if reason and os.environ.get("CI"):
        pytest.fail(f"{reason}: .ci/run installs them, and a skipped test proves nothing")
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp(request.param)
    app = php_sites.start(kind, server, folder)
    port = app.gate_port.release()
    cache_dir = folder / "gate" / "l2"
    argv = [sys.executable, "-m", "crawlergate", "serve", "--port", str(port), *gate_flags(app, cache_dir)]
    env = {"CRAWLERGATE_ADMIN_TOKEN": ADMIN_TOKEN}
    gate = Service("crawlergate-serve", argv, port=port, log_dir=folder / "gate", env=env, probe=_healthz)
    try:
        gate.start()
    except BaseException:
        app.stop()
        raise
    yield Gated(app, gate, cache_dir)
    gate.stop()
    app.stop()


# --- crawlers -----------------------------------------------------------------------------------------


class ProfileSkip:
    """What the gate never caches for this site (the default rules and its profile): not crawled.

    Passed to ``crawl`` as its ``skip`` (only ``search`` is used); it asks the gate's own KeyMaker.
    """

    def __init__(self, profile: str) -> None:
        sites = (profile,) if profile else ()
        self.keys = KeyMaker.from_settings(Settings(cache=CacheSettings(sites=sites)))

    def search(self, target: str) -> bool:
        path, _, query = target.partition("?")
        return self.keys.key_for(path.encode(), query.encode()) is None


def _kinds(result: Crawl) -> str:
    kinds = Counter(_kind(page.url) for page in result.html_pages())
    return ", ".join(f"{kind} {count}" for kind, count in kinds.most_common(8))


def _kind(url: str) -> str:
    parts = urlsplit(url)
    action = re.search(r"(?:^|&)(action|do|replytocom|oldid|diff|paged|p)=", parts.query)
    first = parts.path.split("/")[1] if parts.path.count("/") > 1 else parts.path
    return first + (f"?{action.group(1)}" if action else "")


def test_crawl_twice_second_pass_from_the_cache(site: Gated) -> None:
    skip = cast(re.Pattern[str], ProfileSkip(site.app.profile))
    first = crawl(site.gate_url, skip=skip)
    summary = "\n".join(f"  {p.status} [{p.outcome}] {p.url} {p.location}" for p in first.fetched[:25])
    assert len(first.html_pages()) >= MIN_PAGES, (
        f"{site.name}: first pass reached {len(first.html_pages())} HTML pages of {len(first.fetched)} fetched\n"
        f"{summary}\n{site.logs()}"
    )
    second = crawl(site.gate_url, skip=skip)
    second.assert_from_the_cache(site.name, min_pages=MIN_PAGES, min_percent=MIN_HIT_PERCENT, kinds=_kinds(second))


# --- people -------------------------------------------------------------------------------------------


def mediawiki_person(person: Person, page: str, marker: str) -> None:
    """Log in with Special:UserLogin, edit ``page`` (append ``marker``), log out with Special:UserLogout."""
    title = page.rsplit("/", 1)[-1]
    login = person.send("GET", "/index.php?title=Special:UserLogin", expect=200)
    form = php_sites.form(login.text, name="userlogin")
    fields = {**form.fields, "wpName": php_sites.USER, "wpPassword": php_sites.PASSWORD, "wploginattempt": "Log in"}
    done = person.send("POST", form.action, data=fields, expect=302)
    welcome = person.follow(done)
    assert f'"wgUserName":"{php_sites.USER}"' in welcome.text, f"not logged in:\n{person.history()}"

    editing = person.send("GET", f"/index.php?title={title}&action=edit", expect=200)
    form = php_sites.form(editing.text, id="editform")
    fields = {**form.fields, "wpSummary": "an edit through the gate", "wpSave": "Save changes"}
    fields["wpTextbox1"] = form.fields["wpTextbox1"].rstrip("\n") + f"\n\n{marker}\n"
    saved = person.send("POST", form.action, data=fields, expect=302)
    edited = person.follow(saved)
    assert marker in edited.text and f'"wgUserName":"{php_sites.USER}"' in edited.text, person.history()
    # The member's own view of a page crawlers have stored: never the guest copy, whatever the user agent.
    own = person.send("GET", page, headers=GOOGLEBOT, expect=200)
    assert f'"wgUserName":"{php_sites.USER}"' in own.text

    leaving = person.send("GET", "/index.php?title=Special:UserLogout", expect=200)
    form = php_sites.form(leaving.text, action="Special:UserLogout")
    out = person.send("POST", form.action, data=form.fields, expect=(200, 302, 303))
    after = person.follow(out)
    assert f'"wgUserName":"{php_sites.USER}"' not in after.text, f"still logged in:\n{person.history()}"


def wordpress_person(person: Person, page: str, marker: str) -> None:
    """Log in with wp-login.php, comment on the post at ``page``, log out with the admin bar's link."""
    person.send("GET", "/wp-login.php", expect=200)  # sets wordpress_test_cookie
    fields = {
        "log": php_sites.WP_USER,
        "pwd": php_sites.PASSWORD,
        "wp-submit": "Log In",
        "redirect_to": str(person.client.base_url).rstrip("/") + "/wp-admin/",
        "testcookie": "1",
    }
    dashboard = person.follow(person.send("POST", "/wp-login.php", data=fields, expect=302))
    assert dashboard.status_code == 200 and "wp-admin-bar" in dashboard.text, person.history()
    assert any(name.startswith("wordpress_logged_in_") for name in person.client.cookies), "no logged-in cookie"

    post = person.send("GET", page, expect=200)
    form = php_sites.form(post.text, id="commentform")
    fields = {**form.fields, "comment": marker, "submit": "Post Comment"}
    commented = person.send("POST", form.action, data=fields, expect=302)
    assert urlsplit(commented.headers["location"]).path == page, person.history()
    shown = person.follow(commented)
    assert marker in shown.text, f"the comment is not on the post:\n{person.history()}"
    own = person.send("GET", page, headers=GOOGLEBOT, expect=200)
    assert "wp-admin-bar" in own.text, "the member got the guest copy with Googlebot's user agent"

    out = person.send("GET", php_sites.link(own.text, r"wp-login\.php\?action=logout"), expect=302)
    after = person.follow(out)
    assert after.status_code == 200 and not any(n.startswith("wordpress_logged_in_") for n in person.client.cookies)


def dokuwiki_person(person: Person, page: str, marker: str) -> None:
    """Log in, edit ``page`` (append ``marker``), log out."""
    page_id = page.split("id=", 1)[1]
    login = person.send("GET", f"/doku.php?id={page_id}&do=login", expect=200)
    form = php_sites.form(login.text, id="dw__login")
    fields = {**form.fields, "u": "admin", "p": php_sites.PASSWORD}
    logged_in = person.follow(person.send("POST", form.action or "/doku.php", data=fields, expect=(200, 302, 303)))
    assert "do=logout" in logged_in.text, f"not logged in:\n{person.history()}"
    editing = person.send("GET", f"/doku.php?id={page_id}&do=edit", expect=200)
    form = php_sites.form(editing.text, id="dw__editform")
    fields = {**form.fields, "do[save]": "Save", "summary": "an edit through the gate"}
    fields["wikitext"] = form.fields["wikitext"].rstrip("\n") + f"\n\n{marker}\n"
    saved = person.follow(person.send("POST", form.action or "/doku.php", data=fields, expect=(200, 302, 303)))
    assert marker in saved.text, person.history()
    out = person.send("GET", php_sites.link(saved.text, r"do=logout"), expect=(200, 302, 303))
    after = person.follow(out)
    assert "do=logout" not in after.text, f"still logged in:\n{person.history()}"


PERSON = {"mediawiki": mediawiki_person, "wordpress": wordpress_person, "dokuwiki": dokuwiki_person}


def test_person_changes_a_page_and_crawlers_get_it_after_regeneration(site: Gated) -> None:
    page = site.app.member_page
    marker = f"Changed through the gate {time.time_ns()}"
    with no_cookies_client(site.gate_url, GOOGLEBOT) as crawler:
        crawler.get(page)
        stored = crawler.get(page)
    assert stored.status_code == 200 and stored.headers.get("x-crawlergate") in HITS, (
        f"{site.name}: {page} is not stored: {stored.status_code} [{stored.headers.get('x-crawlergate')}]\n"
        + site.logs()
    )

    with Person(site.gate_url, via_gate=True) as person:
        PERSON[site.app.kind](person, page, marker)
        print(f"{site.name}: the person's visit\n{person.history()}")

    deadline = time.monotonic() + 10
    while not site.marked():  # marks are made off the request path
        assert time.monotonic() < deadline, f"{site.name}: no page was marked changed\n{site.logs()}"
        time.sleep(0.2)
    time.sleep(1)  # PURGE requests come after the response (MediaWiki's deferred updates)
    marked = site.marked()
    print(f"{site.name}: marked {marked}")
    assert page in [target for target, _ in marked], (
        f"{site.name}: the changed page {page} was not marked; marked: {marked}"
    )

    with no_cookies_client(site.gate_url, GOOGLEBOT) as crawler:
        kept = crawler.get(page)
    assert kept.headers.get("x-crawlergate") in HITS and marker not in kept.text, (
        f"{site.name}: before regeneration crawlers keep the stored copy: {kept.headers.get('x-crawlergate')}"
    )

    summary = run(
        [sys.executable, "-m", "crawlergate", "regenerate", "--dirty", "--origin-share", "0", *site.gate_flags()],
        timeout=180,
    )
    print(f"{site.name}: regenerate\n{summary}")
    outcomes = []
    with no_cookies_client(site.gate_url, GOOGLEBOT) as crawler:
        for _ in range(5):  # the embedded L1 drops the old copy when it next reads the index
            fresh = crawler.get(page)
            outcomes.append(str(fresh.headers.get("x-crawlergate")))
            if marker in fresh.text:
                break
            time.sleep(0.6)
    assert marker in fresh.text, f"{site.name}: crawlers never got the changed page ({outcomes})\n{summary}"
    assert fresh.headers.get("x-crawlergate") in HITS, f"{site.name}: the new page was not served from the cache"
