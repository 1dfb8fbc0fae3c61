"""End to end with real applications we did not write: Trac and a Django project, behind the gate.

Four set-ups, each on its own free loopback ports and its own copy of the site's data:

- ``trac-serve``: ``tracd`` with ``crawlergate serve --public-url`` in front (both subprocesses);
- ``trac-wsgi``: Trac's WSGI app inside ``CrawlerGateWSGI`` under gunicorn (2 sync workers);
- ``django-serve``: the Django project under gunicorn with ``crawlergate serve`` in front;
- ``django-wsgi``: the Django project inside ``CrawlerGateWSGI`` under gunicorn;

plus the Django project with ``SECURE_SSL_REDIRECT`` behind a simulated TLS front (``--public-url
https://...``, ``X-Forwarded-Proto: https`` from loopback), both ways. The gate is configured with
its public URL, origin, port and cache folder only: no rules for these sites.

The sites' own servers for ``serve`` (``tracd``, gunicorn) start once per session and are also used
alone: to show the sites work without the gate, and by the ``crawlergate check`` tests. Each gate
starts when a test first needs its set-up and stops when the tests move on to the next one. Every
process runs in its own process group and is killed on teardown, failed or not; a process that does
not start fails the test with its output.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from tests.sites import people, trac_site
from tests.sites.crawl import HITS, Crawl, crawl, first_difference, no_cookies_client, normalise
from tests.sites.processes import VENV_BIN, PortReservation, Service, free_port, run
from tests.visitors import CHROME, GOOGLEBOT

pytestmark = pytest.mark.e2e

DJANGO_APP = "tests.sites.django_site.wsgi:application"
TRAC_APP = "tests.sites.trac_wsgi:application"
GATED_APP = "tests.sites.gated_wsgi:application"
MIN_PAGES = 100
MIN_HIT_PERCENT = 95.0
COMPARED_PAGES = 12
GUNICORN_WORKERS = "2"


@dataclass
class Site:
    """One running set-up: where crawlers and people go, and how a guest sees the live site."""

    name: str
    kind: str  # "trac" | "django"
    gate_url: str
    public_url: str
    origin_url: str | None  # the site's own server (serve set-ups); None when the gate is inside it
    crawl_skip: re.Pattern[str] | None = None
    services: list[Service] = field(default_factory=list)  # started for this set-up, stopped with it
    borrowed: list[Service] = field(default_factory=list)  # shared with other tests (a serve set-up's origin)

    @property
    def public_host(self) -> str:
        return urlsplit(self.public_url).netloc

    def guest_fetch(self, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
        """The page straight from the live site as a guest: no cookie, the public Host.

        With ``serve`` that is the origin itself, asked the way a fill asks it; with the WSGI gate the
        site is only reachable through the gate, where a person without cookies passes to it.
        """
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        # A fill sends no Accept-Language, so a site that negotiates (Trac, once Babel is installed: mkdocs-material
        # brings it) gives its default language; the person asking here must not ask for another.
        guest = {name: value for name, value in CHROME.items() if name != "accept-language"}
        if self.origin_url is None:
            return httpx.get(self.gate_url + target, headers={**guest, **(headers or {})}, timeout=30)
        forwarded = {
            "host": self.public_host,
            "x-forwarded-host": self.public_host,
            "x-forwarded-proto": urlsplit(self.public_url).scheme,
        }
        return httpx.get(self.origin_url + target, headers={**guest, **forwarded, **(headers or {})}, timeout=30)

    def logs(self) -> str:
        return "\n".join(
            f"--- {service.name} ({service.log_path}):\n{service.log_tail(3000)}"
            for service in self.borrowed + self.services
        )

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()


# --- building and starting the sites ------------------------------------------------------------------


@pytest.fixture(scope="session")
def trac_project(tmp_path_factory: pytest.TempPathFactory) -> trac_site.TracProject:
    return trac_site.build(tmp_path_factory.mktemp("trac-project"))


@pytest.fixture(scope="session")
def django_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, seeded SQLite database: copied for each set-up."""
    db = tmp_path_factory.mktemp("django-project") / "db.sqlite3"
    env = {"SITE_DB": str(db), "DJANGO_SETTINGS_MODULE": "tests.sites.django_site.settings"}
    run([sys.executable, "-m", "django", "migrate", "--run-syncdb", "--verbosity", "0"], env=env)
    run([sys.executable, "-m", "tests.sites.django_site.seed"], env=env)
    return db


def _healthz(client: httpx.Client) -> bool:
    return client.get("/_crawlergate/healthz").status_code == 200


def _serve(origin: str, public_url: str, port: int, folder: Path, extra: tuple[str, ...] = ()) -> Service:
    argv = [sys.executable, "-m", "crawlergate", "serve", "--origin", origin, "--public-url", public_url]
    argv += ["--port", str(port), "--cache-dir", str(folder / "l2"), *extra]
    return Service("crawlergate-serve", argv, port=port, log_dir=folder, probe=_healthz)


def _gunicorn(name: str, app: str, port: int, folder: Path, env: dict[str, str], probe) -> Service:
    argv = [str(VENV_BIN / "gunicorn"), "--workers", GUNICORN_WORKERS, "--worker-class", "sync"]
    argv += ["--bind", f"127.0.0.1:{port}", "--timeout", "60", "--graceful-timeout", "5", app]
    return Service(name, argv, port=port, log_dir=folder, env=env, probe=probe)


def _gated(site_app: str, public_url: str, folder: Path) -> dict[str, str]:
    """How a deployment would configure the WSGI gate: CRAWLERGATE_* variables."""
    return {
        "SITE_WSGI_APP": site_app,
        "CRAWLERGATE_SERVER_PUBLIC_URL": public_url,
        "CRAWLERGATE_L2_CACHE_DIR": str(folder / "l2"),
    }


def _start(site: Site) -> Site:
    try:
        for service in site.services:
            service.start()
    except BaseException:
        site.stop()
        raise
    return site


@dataclass
class Origin:
    """A site's own server (for ``serve``), started knowing the public address its gate will have."""

    kind: str
    service: Service
    public_url: str
    gate_port: PortReservation  # held until the gate starts
    folder: Path
    crawl_skip: re.Pattern[str] | None = None

    @property
    def public_host(self) -> str:
        return urlsplit(self.public_url).netloc

    def stop(self) -> None:
        self.gate_port.release()
        self.service.stop()


def start_trac_origin(project: trac_site.TracProject, folder: Path) -> Origin:
    project = project.copy(folder)
    gate_port = PortReservation()
    public_url = f"http://127.0.0.1:{gate_port.port}"
    service = trac_site.tracd(project, folder, urlsplit(public_url).netloc)
    try:
        service.start()
    except BaseException:
        gate_port.release()
        raise
    return Origin("trac", service, public_url, gate_port, folder, crawl_skip=trac_site.CRAWL_SKIP)


def _django_env(db_template: Path, folder: Path, public_host: str, tls: bool) -> dict[str, str]:
    db = folder / "db.sqlite3"
    db.write_bytes(db_template.read_bytes())
    return {
        "DJANGO_SETTINGS_MODULE": "tests.sites.django_site.settings",
        "SITE_DB": str(db),
        "SITE_PUBLIC_HOST": public_host,
        "SITE_SSL_REDIRECT": "1" if tls else "",
    }


def _django_probe(public_host: str, secure: bool):
    headers = {"host": public_host, **({"x-forwarded-proto": "https"} if secure else {})}

    def probe(client: httpx.Client) -> bool:
        return client.get("/", headers=headers).status_code == 200

    return probe


def start_django_origin(db_template: Path, folder: Path, *, tls: bool = False) -> Origin:
    gate_port = PortReservation()
    public_url = f"{'https' if tls else 'http'}://127.0.0.1:{gate_port.port}"
    public_host = urlsplit(public_url).netloc
    env = _django_env(db_template, folder, public_host, tls)
    service = _gunicorn("gunicorn-django", DJANGO_APP, free_port(), folder, env, _django_probe(public_host, tls))
    try:
        service.start()
    except BaseException:
        gate_port.release()
        raise
    return Origin("django", service, public_url, gate_port, folder)


def gate_in_front(name: str, origin: Origin, *, own_origin: bool = False, extra: tuple[str, ...] = ()) -> Site:
    """``crawlergate serve`` on the port the origin was told is public.

    ``own_origin``: the origin belongs to this set-up and stops with it; otherwise it is shared. ``extra``:
    more ``serve`` arguments.
    """
    port = origin.gate_port.release()
    gate_url = f"http://127.0.0.1:{port}"
    site = Site(name, origin.kind, gate_url, origin.public_url, origin.service.url, crawl_skip=origin.crawl_skip)
    gate = _serve(origin.service.url, origin.public_url, port, origin.folder / name, extra)
    if own_origin:
        site.services = [origin.service, gate]
    else:
        site.services, site.borrowed = [gate], [origin.service]
    try:
        gate.start()
    except BaseException:
        site.stop()
        raise
    return site


def start_trac_wsgi(project: trac_site.TracProject, folder: Path) -> Site:
    project = project.copy(folder)
    port = free_port()
    public_url = f"http://127.0.0.1:{port}"
    site = Site("trac-wsgi", "trac", public_url, public_url, None, crawl_skip=trac_site.CRAWL_SKIP)
    env = {**trac_site.wsgi_env(project), **_gated(TRAC_APP, public_url, folder)}
    site.services = [_gunicorn("gunicorn-trac-gated", GATED_APP, port, folder, env, _healthz)]
    return _start(site)


def start_django_wsgi(db_template: Path, folder: Path, *, tls: bool = False) -> Site:
    port = free_port()
    public_url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    site = Site(f"django-wsgi{'-tls' if tls else ''}", "django", f"http://127.0.0.1:{port}", public_url, None)
    env = {**_django_env(db_template, folder, site.public_host, tls), **_gated(DJANGO_APP, public_url, folder)}
    site.services = [_gunicorn("gunicorn-django-gated", GATED_APP, port, folder, env, _healthz)]
    return _start(site)


@pytest.fixture(scope="session")
def trac_origin(trac_project: trac_site.TracProject, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Origin]:
    origin = start_trac_origin(trac_project, tmp_path_factory.mktemp("trac-origin"))
    yield origin
    origin.stop()


@pytest.fixture(scope="session")
def django_origin(django_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Origin]:
    origin = start_django_origin(django_db, tmp_path_factory.mktemp("django-origin"))
    yield origin
    origin.stop()


SETUPS = ["trac-serve", "trac-wsgi", "django-serve", "django-wsgi"]


@pytest.fixture(scope="session", params=SETUPS)
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    kind, mode = request.param.split("-")
    if mode == "serve":
        running = gate_in_front(request.param, request.getfixturevalue(f"{kind}_origin"))
    elif kind == "trac":
        running = start_trac_wsgi(request.getfixturevalue("trac_project"), tmp_path_factory.mktemp(request.param))
    else:
        running = start_django_wsgi(request.getfixturevalue("django_db"), tmp_path_factory.mktemp(request.param))
    yield running
    running.stop()


@pytest.fixture(scope="session", params=["serve", "wsgi"])
def tls_site(
    request: pytest.FixtureRequest, django_db: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    folder = tmp_path_factory.mktemp(f"django-{request.param}-tls")
    if request.param == "serve":
        running = gate_in_front("django-serve-tls", start_django_origin(django_db, folder, tls=True), own_origin=True)
    else:
        running = start_django_wsgi(django_db, folder, tls=True)
    yield running
    running.stop()


def only(*names: str):
    """Run a test on some set-ups only."""
    return pytest.mark.parametrize("site", names, indirect=True)


# --- the sites themselves, without the gate -------------------------------------------------------------


def _origin_alone(origin: Origin) -> None:
    if origin.kind == "django":
        # Only the public host:port is served: a fill with any other Host would get 400.
        for wrong in (urlsplit(origin.service.url).netloc, "localhost", f"127.0.0.1:{origin.gate_port.port + 1}"):
            answer = httpx.get(origin.service.url + "/", headers={**CHROME, "host": wrong})
            assert answer.status_code == 400, f"Host {wrong}: {answer.status_code}"
    host = {"host": origin.public_host}
    direct = crawl(origin.service.url, max_pages=MIN_PAGES, headers={**GOOGLEBOT, **host}, skip=origin.crawl_skip)
    assert len(direct.html_pages()) >= MIN_PAGES, _crawl_summary(direct)
    print(f"{origin.kind} alone: {_kinds(direct)}")
    # Trac builds absolute redirects from the Host it gets: talk to it by its own address.
    person_host = origin.public_host if origin.kind == "django" else None
    with people.Person(origin.service.url, via_gate=False, host=person_host) as person:
        (people.trac_person if origin.kind == "trac" else people.django_person)(person)


def test_trac_alone_serves_the_crawl_and_the_person(trac_origin: Origin) -> None:
    """Trac works without the gate: a crawl reaches 100 pages, the person's visit succeeds."""
    _origin_alone(trac_origin)


def test_django_alone_serves_the_crawl_and_the_person(django_origin: Origin) -> None:
    """The Django project works without the gate: a crawl reaches 100 pages, the person's visit succeeds."""
    _origin_alone(django_origin)


# --- crawlers -----------------------------------------------------------------------------------------


def _kinds(result: Crawl) -> str:
    """How many pages of each kind (first path segment) a crawl reached."""
    kinds = Counter(urlsplit(page.url).path.split("/")[1] or "/" for page in result.html_pages())
    return ", ".join(f"{kind} {count}" for kind, count in kinds.most_common())


def _crawl_summary(result: Crawl, limit: int = 15) -> str:
    lines = [f"{len(result.html_pages())} HTML pages of {len(result.fetched)} fetched; first answers:"]
    lines += [f"  {page.status} [{page.outcome}] {page.url} {page.location}" for page in result.fetched[:limit]]
    return "\n".join(lines)


def test_crawl_twice_second_pass_from_the_cache(site: Site) -> None:
    first = crawl(site.gate_url, skip=site.crawl_skip)
    assert len(first.html_pages()) >= MIN_PAGES, f"{site.name}: first pass\n{_crawl_summary(first)}\n{site.logs()}"
    second = crawl(site.gate_url, skip=site.crawl_skip)
    second.assert_from_the_cache(site.name, min_pages=MIN_PAGES, min_percent=MIN_HIT_PERCENT, kinds=_kinds(second))

    # What the cache serves is the guest page of the live site, apart from tokens and times.
    hits = [page for page in second.pages if page.cacheable and page.outcome in HITS]
    step = max(1, len(hits) // COMPARED_PAGES)
    differences = []
    for page in hits[::step][:COMPARED_PAGES]:
        live = site.guest_fetch(page.url)
        assert live.status_code == 200, f"{page.url}: the live site answered {live.status_code}"
        cached, fresh = normalise(page.body), normalise(live.text)
        if cached != fresh:
            differences.append(f"{page.url} {first_difference(cached, fresh)}")
    assert not differences, f"{site.name}: cached pages differ from the live guest page:\n" + "\n".join(differences)


# --- people -------------------------------------------------------------------------------------------


def test_person_logs_in_posts_uploads_and_logs_out(site: Site) -> None:
    member_page = people.TRAC_MEMBER_PAGE if site.kind == "trac" else people.DJANGO_ITEM
    # Crawlers have the page the member will open: the member must still get their own.
    with no_cookies_client(site.gate_url, GOOGLEBOT) as crawler:
        for _ in range(2):
            crawler.get(member_page)
    with people.Person(site.gate_url, via_gate=True) as person:
        (people.trac_person if site.kind == "trac" else people.django_person)(person)
        print(f"{site.name}: the person's visit\n{person.history()}")


def test_trac_write_rules_mark_what_a_person_changed(trac_project: trac_site.TracProject, tmp_path: Path) -> None:
    """The Trac profile's write rules, in front of a real Trac: a new ticket and an attachment mark the
    timeline; crawlers keep the stored timeline (its age growing) instead of the origin paying for it."""
    origin = start_trac_origin(trac_project, tmp_path)
    site = gate_in_front("trac-profile", origin, own_origin=True, extra=("--site", "trac"))
    try:
        with no_cookies_client(site.gate_url, GOOGLEBOT) as crawler:
            stored = crawler.get("/timeline")
            assert crawler.get("/timeline").headers["x-crawlergate"] == "l1-hit", "the timeline is not stored"
        with people.Person(site.gate_url, via_gate=True) as person:
            people.trac_person(person)
        deadline = time.monotonic() + 10
        while httpx.get(f"{site.gate_url}/_crawlergate/stats").json()["dirty"] < 1:  # marked off the request path
            assert time.monotonic() < deadline, "no page was marked changed"
            time.sleep(0.1)
        with no_cookies_client(site.gate_url, GOOGLEBOT) as crawler:
            kept = crawler.get("/timeline")
        assert kept.headers["x-crawlergate"] == "l1-hit" and kept.text == stored.text
        assert "age" in kept.headers
    finally:
        site.stop()


# --- TLS front ----------------------------------------------------------------------------------------


def test_tls_front_crawler_is_never_redirected_to_its_own_url(tls_site: Site) -> None:
    """SECURE_SSL_REDIRECT behind a TLS front: fills must say https, or the gate stores a redirect loop."""
    site = tls_site
    if site.origin_url is not None:
        # The switch is on: the origin asked over plain http redirects to https.
        plain = httpx.get(f"{site.origin_url}/items/1/", headers={**CHROME, "host": site.public_host})
        assert plain.status_code == 301 and plain.headers["location"] == f"{site.public_url}/items/1/"
    crawler_headers = {**GOOGLEBOT, "x-forwarded-proto": "https"}
    passes: list[list[tuple[str, httpx.Response]]] = []
    with no_cookies_client(site.gate_url, crawler_headers) as crawler:
        for _ in range(2):
            passes.append([(path, crawler.get(path)) for path in (f"/items/{n}/" for n in range(1, 121))])
    loops = [
        f"{path}: {response.status_code} [{response.headers.get('x-crawlergate')}] -> {response.headers['location']}"
        for answers in passes
        for path, response in answers
        if response.is_redirect
        and _same_page(urljoin(site.public_url + path, response.headers["location"]), site.public_url + path)
    ]
    assert not loops, f"{site.name}: crawlers redirected to the URL they asked for:\n" + "\n".join(loops[:10])
    not_ok = [f"{path}: {response.status_code}" for path, response in passes[0] if response.status_code != 200]
    assert not not_ok, f"{site.name}: item pages not 200 for crawlers:\n" + "\n".join(not_ok[:10])
    hits = sum(1 for _, response in passes[1] if response.headers.get("x-crawlergate") in HITS)
    percent = 100.0 * hits / len(passes[1])
    print(f"{site.name}: second pass {percent:.1f} % of {len(passes[1])} item pages from the cache")
    assert percent >= MIN_HIT_PERCENT, f"{site.name}: second pass {percent:.1f} % from the cache"


def _same_page(a: str, b: str) -> bool:
    x, y = urlsplit(a), urlsplit(b)
    return (x.hostname, x.port or 443, x.path, x.query) == (y.hostname, y.port or 443, y.path, y.query)


# --- headers crawlers need ----------------------------------------------------------------------------


@only("django-serve", "django-wsgi")
def test_robots_tag_and_link_reach_crawlers_on_hits(site: Site) -> None:
    live = site.guest_fetch("/noindex/")
    assert live.headers.get("x-robots-tag") == "noindex"
    assert live.headers.get("link") == f'<{site.public_url}/items/>; rel="canonical"'
    with no_cookies_client(site.gate_url, GOOGLEBOT) as crawler:
        answers = [crawler.get("/noindex/") for _ in range(3)]
    outcomes = [answer.headers.get("x-crawlergate") for answer in answers]
    assert outcomes[-1] in HITS, f"/noindex/ never came from the cache: {outcomes}"
    for answer in answers:
        assert answer.headers.get("x-robots-tag") == "noindex", (
            f"{answer.headers.get('x-crawlergate')}: {answer.headers}"
        )
        assert answer.headers.get("link") == live.headers["link"], (
            f"{answer.headers.get('x-crawlergate')}: {answer.headers}"
        )


# --- stats --------------------------------------------------------------------------------------------


@only("django-serve")
def test_stats_count_crawler_pages_not_stored(site: Site) -> None:
    with no_cookies_client(site.gate_url, GOOGLEBOT) as crawler:
        nostore = crawler.get("/nostore/")
        excluded = crawler.get("/accounts/login/")
    assert nostore.status_code == 200 and excluded.status_code == 200
    assert nostore.headers.get("x-crawlergate") == "miss" and excluded.headers.get("x-crawlergate") == "pass"
    stats = httpx.get(f"{site.gate_url}/_crawlergate/stats").json()
    assert stats["crawler"]["requests"] >= 2 and "human" in stats, stats
    assert stats["not_stored"].get("no-store", 0) >= 1, stats["not_stored"]
    assert stats["not_stored"].get("excluded", 0) >= 1, stats["not_stored"]


# --- crawlergate check --------------------------------------------------------------------------------
# Against the sites' own servers (no gate needed): ``check`` fetches the page as a fill would.


@pytest.fixture(params=["trac", "django"])
def origin(request: pytest.FixtureRequest) -> Origin:
    return request.getfixturevalue(f"{request.param}_origin")


def _check(origin: Origin, path: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    from crawlergate.cli import main

    url = origin.public_url + path
    code = main(["check", url, "--origin", origin.service.url, "--public-url", origin.public_url, *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def no_crawlergate_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("CRAWLERGATE_"):
            monkeypatch.delenv(name)


# Pages that set a cookie for every guest: Trac's trac_form_token and trac_session, Django's csrftoken.
NORMAL_PAGE = {"trac": "/wiki/Topic01", "django": "/items/3/"}
EXCLUDED_PAGE = {"trac": "/login", "django": "/accounts/login/"}


@pytest.mark.usefixtures("no_crawlergate_environment")
def test_check_stores_a_normal_page_in_guest_mode(origin: Origin, capsys: pytest.CaptureFixture[str]) -> None:
    code, output = _check(origin, NORMAL_PAGE[origin.kind], capsys)
    assert code == 0, output


@pytest.mark.usefixtures("no_crawlergate_environment")
def test_check_names_an_excluded_path(origin: Origin, capsys: pytest.CaptureFixture[str]) -> None:
    code, output = _check(origin, EXCLUDED_PAGE[origin.kind], capsys)
    assert code == 1 and "excluded" in output, output


@pytest.mark.usefixtures("no_crawlergate_environment")
def test_check_names_no_store(django_origin: Origin, capsys: pytest.CaptureFixture[str]) -> None:
    code, output = _check(django_origin, "/nostore/", capsys)
    assert code == 1 and "no-store" in output, output


@pytest.mark.usefixtures("no_crawlergate_environment")
def test_check_strict_mode_names_the_cookie(
    origin: Origin, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both ways of choosing strict mode: a config file (Trac) and the environment (Django).
    extra: list[str] = []
    if origin.kind == "trac":
        config = tmp_path / "strict.toml"
        config.write_text('[cache]\nstorage_mode = "rfc9111"\n', encoding="utf-8")
        extra = ["--config", str(config)]
    else:
        monkeypatch.setenv("CRAWLERGATE_CACHE_STORAGE_MODE", "rfc9111")
    live = httpx.get(origin.service.url + NORMAL_PAGE[origin.kind], headers={**CHROME, "host": origin.public_host})
    assert "set-cookie" in live.headers, "the page no longer sets a cookie: pick another"
    code, output = _check(origin, NORMAL_PAGE[origin.kind], capsys, *extra)
    assert code == 1 and "set-cookie-strict" in output, output
