"""The examples in examples/: FastAPI, Flask and Django sites with the gate mounted, each visited by a
crawler, a guest and a member who logs in through the site's own form.

Driven in-process through httpx: WSGITransport for Flask and Django's WSGI application,
ASGITransport for FastAPI and Django's ASGI application (called from this synchronous test through
an anyio portal, with the lifespan run around the requests, as uvicorn would). A framework that is
not installed skips its tests, except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from tests.visitors import FIREFOX, FIREFOX_UA, GOOGLEBOT_UA

MEMBER, PASSWORD = "alice", "wonderland"
BASE_URL = "http://localhost"

# The modules each example imports that the project itself does not install.
REQUIRES = {
    "fastapi": ("fastapi", "itsdangerous"),
    "flask": ("flask",),
    "django-wsgi": ("django",),
    "django-asgi": ("django",),
}


def _require(framework: str) -> None:
    missing = [name for name in REQUIRES[framework] if importlib.util.find_spec(name) is None]
    if missing:
        message = f"{', '.join(missing)} not installed (pip install -e '.[test]')"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: CI must run every example")
        pytest.skip(message)


class Browser:
    """One visitor: its own cookies, a user agent (changeable per request), the gate in-process."""

    def __init__(self, client: httpx.Client | httpx.AsyncClient, portal: BlockingPortal | None, user_agent: str):
        self.client = client
        self.portal = portal
        self.user_agent = user_agent

    def request(self, method: str, path: str, *, user_agent: str | None = None, **kwargs: Any) -> httpx.Response:
        user_agent = user_agent or self.user_agent
        # A browser sends what a browser sends on a page load (the gate's evidence looks for it).
        headers = {**FIREFOX, "user-agent": user_agent} if user_agent == FIREFOX_UA else {"user-agent": user_agent}
        request = self.client.build_request(method, path, headers=headers, **kwargs)
        if isinstance(self.client, httpx.AsyncClient):
            assert self.portal is not None
            return self.portal.call(self.client.send, request)
        return self.client.send(request)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)


@dataclass
class Example:
    """A framework's example site inside the gate; ``browser`` makes a new visitor."""

    framework: str
    app: Any
    portal: BlockingPortal | None = None
    browsers: list[Browser] = field(default_factory=list)

    def browser(self, user_agent: str) -> Browser:
        if self.portal is None:
            client: httpx.Client | httpx.AsyncClient = httpx.Client(
                transport=httpx.WSGITransport(app=self.app), base_url=BASE_URL
            )
        else:
            client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url=BASE_URL)
        self.browsers.append(Browser(client, self.portal, user_agent))
        return self.browsers[-1]

    def close_browsers(self) -> None:
        for browser in self.browsers:
            if isinstance(browser.client, httpx.AsyncClient):
                assert self.portal is not None
                self.portal.call(browser.client.aclose)
            else:
                browser.client.close()


@contextlib.asynccontextmanager
async def _lifespan(app: Any) -> AsyncIterator[None]:
    """Run ``app``'s lifespan around the block, as an ASGI server does."""
    to_app, app_inbox = anyio.create_memory_object_stream[dict[str, Any]](2)
    app_outbox, from_app = anyio.create_memory_object_stream[dict[str, Any]](2)
    with to_app, app_inbox, app_outbox, from_app:
        async with anyio.create_task_group() as tasks:
            scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
            tasks.start_soon(app, scope, app_inbox.receive, app_outbox.send)
            await to_app.send({"type": "lifespan.startup"})
            assert (await from_app.receive())["type"] == "lifespan.startup.complete"
            yield
            await to_app.send({"type": "lifespan.shutdown"})
            assert (await from_app.receive())["type"] == "lifespan.shutdown.complete"


@contextlib.contextmanager
def _served_asgi(framework: str, app: Any) -> Iterator[Example]:
    with start_blocking_portal("asyncio") as portal, portal.wrap_async_context_manager(_lifespan(app)):
        example = Example(framework, app, portal)
        try:
            yield example
        finally:
            example.close_browsers()


@contextlib.contextmanager
def _served_wsgi(framework: str, app: Any, close: Callable[[], None]) -> Iterator[Example]:
    example = Example(framework, app)
    try:
        yield example
    finally:
        example.close_browsers()
        close()


@pytest.fixture(scope="session")
def django_project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType]]:
    """The Django example configured once for the session (Django's settings are per process): a migrated SQLite
    file of its own, the member created; its wsgi and asgi modules."""
    _require("django-wsgi")
    db = tmp_path_factory.mktemp("django-example") / "db.sqlite3"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DJANGO_SETTINGS_MODULE", "examples.django_site.settings")
        env.setenv("DJANGO_DB_PATH", str(db))
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        from django.contrib.auth import get_user_model

        get_user_model().objects.create_user(MEMBER, password=PASSWORD)
        wsgi = importlib.import_module("examples.django_site.wsgi")
        asgi = importlib.import_module("examples.django_site.asgi")
    yield wsgi, asgi
    from django.db import connections

    connections.close_all()


@pytest.fixture(params=list(REQUIRES))
def example(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Example]:
    framework: str = request.param
    _require(framework)
    cache_dir = str(tmp_path / "l2")
    if framework == "fastapi":
        from examples.fastapi_app import create_app

        with _served_asgi(framework, create_app(cache_dir)) as served:
            yield served
    elif framework == "flask":
        from examples.flask_app import create_app as create_flask_app

        app = create_flask_app(cache_dir)
        with _served_wsgi(framework, app, app.extensions["crawlergate"].close) as served:
            yield served
    else:
        wsgi, asgi = request.getfixturevalue("django_project")
        if framework == "django-wsgi":
            gate = wsgi.create_application(cache_dir)
            with _served_wsgi(framework, gate, gate.close) as served:
                yield served
        else:
            with _served_asgi(framework, asgi.create_application(cache_dir)) as served:
                yield served


def _log_in(browser: Browser, password: str = PASSWORD) -> httpx.Response:
    """Log in through the site's form, as a person does: fetch it, then post it with its CSRF token if it has one."""
    form = browser.get("/login")
    assert (form.status_code, form.headers["x-crawlergate"]) == (200, "pass")
    fields = {"username": MEMBER, "password": password}
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    if token is not None:
        fields["csrfmiddlewaretoken"] = token.group(1)
    return browser.post("/login", data=fields)


def test_example_crawler_gets_miss_then_l1_hit(example: Example) -> None:
    crawler = example.browser(GOOGLEBOT_UA)
    first, second = crawler.get("/articles/1"), crawler.get("/articles/1")
    assert (first.status_code, first.headers["x-crawlergate"]) == (200, "miss")
    assert (second.status_code, second.headers["x-crawlergate"]) == (200, "l1-hit")
    assert "Why crawlers cost so much" in second.text and "Hello, guest" in second.text
    assert second.text == first.text
    assert "set-cookie" not in second.headers


def test_example_guest_person_gets_the_site(example: Example) -> None:
    person = example.browser(FIREFOX_UA)
    for _ in range(2):
        page = person.get("/articles/1")
        assert (page.status_code, page.headers["x-crawlergate"]) == (200, "pass")
        assert "Why crawlers cost so much" in page.text and "Hello, guest" in page.text


def test_example_member_sees_own_name_and_crawlers_never_get_it(example: Example) -> None:
    member = example.browser(FIREFOX_UA)
    crawler = example.browser(GOOGLEBOT_UA)
    assert crawler.get("/articles/1").headers["x-crawlergate"] == "miss"

    logged_in = _log_in(member)
    assert logged_in.status_code in (302, 303) and logged_in.headers["location"] == "/"
    assert logged_in.headers["x-crawlergate"] == "pass"
    # The member's own pages, also with a crawler's user agent: the session cookie means the live site.
    for path in ("/", "/articles/1", "/articles/2"):
        for user_agent in (FIREFOX_UA, GOOGLEBOT_UA):
            page = member.get(path, user_agent=user_agent)
            assert (page.status_code, page.headers["x-crawlergate"]) == (200, "pass"), (path, user_agent)
            assert f"Hello, {MEMBER}" in page.text and "Hello, guest" not in page.text

    # Crawlers get guest pages only: the stored one, and for pages only the member had seen, a guest fill.
    for path, outcomes in (("/articles/1", ("l1-hit", "l1-hit")), ("/articles/2", ("miss", "l1-hit"))):
        for outcome in outcomes:
            page = crawler.get(path)
            assert (page.status_code, page.headers["x-crawlergate"]) == (200, outcome), path
            assert "Hello, guest" in page.text and MEMBER not in page.text
    assert crawler.get("/").headers["x-crawlergate"] == "miss"
    assert MEMBER not in crawler.get("/").text


def test_example_wrong_password_is_refused(example: Example) -> None:
    person = example.browser(FIREFOX_UA)
    refused = _log_in(person, password="not-the-password")
    assert refused.status_code in (200, 401) and refused.headers["x-crawlergate"] == "pass"
    assert "Wrong user name or password." in refused.text
    assert "Hello, guest" in person.get("/", user_agent=GOOGLEBOT_UA).text


@pytest.mark.parametrize("framework", ["django-wsgi", "django-asgi"])
def test_example_django_login_needs_its_csrf_token(
    framework: str, django_project: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    wsgi, asgi = django_project
    cache_dir = str(tmp_path / "l2")
    served = (
        _served_wsgi(framework, gate := wsgi.create_application(cache_dir), gate.close)
        if framework == "django-wsgi"
        else _served_asgi(framework, asgi.create_application(cache_dir))
    )
    with served as example:
        person = example.browser(FIREFOX_UA)
        assert person.get("/login").headers["x-crawlergate"] == "pass"
        assert "csrftoken" in person.client.cookies
        forged = person.post("/login", data={"username": MEMBER, "password": PASSWORD})
        assert (forged.status_code, forged.headers["x-crawlergate"]) == (403, "pass")
        assert "sessionid" not in person.client.cookies
