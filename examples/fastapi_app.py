"""A FastAPI site inside CrawlerGateMiddleware.

Public article pages, a login form that puts the user in Starlette's signed session cookie, and a
greeting on every page ("Hello, alice" once logged in). Crawlers get the guest pages from the
gate's cache; people, and anyone with the session cookie, always get the live site.

    uvicorn --factory examples.fastapi_app:create_app

The gate's settings come from ``crawlergate.toml`` named by ``CRAWLERGATE_CONFIG`` and from
``CRAWLERGATE_*`` variables (``CRAWLERGATE_L2_CACHE_DIR=/var/cache/crawlergate``); ``create_app``'s
``cache_dir`` overrides the L2 folder. Needs ``fastapi`` and ``itsdangerous`` (the session cookie). The
form is read with the standard library: FastAPI's ``Form`` needs python-multipart, whose ``multipart``
module stands in for the one Trac and others import.
"""

from __future__ import annotations

import hmac
import os
import secrets
from html import escape
from urllib.parse import parse_qs

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.middleware.sessions import SessionMiddleware

from crawlergate import CrawlerGateMiddleware, load_settings

ARTICLES = {
    1: ("Why crawlers cost so much", "They fetch every dynamic page, day and night."),
    2: ("Guest pages for crawlers", "A crawler never needs a page made for one person."),
    3: ("Two cache levels", "Memory first, then gzip files on disk."),
}
# A demo account; a real site checks a password hash in its user table.
USERS = {"alice": "wonderland"}


def _page(request: Request, title: str, body: str, status_code: int = 200) -> HTMLResponse:
    user = request.session.get("user")
    if user:
        greeting = f'Hello, {escape(user)} <form method="post" action="/logout"><button>Log out</button></form>'
    else:
        greeting = 'Hello, guest. <a href="/login">Log in</a>'
    html = (
        f"<!doctype html><html><head><title>{escape(title)}</title></head><body>"
        f'<header><a href="/">Home</a> {greeting}</header><main><h1>{escape(title)}</h1>{body}</main></body></html>'
    )
    return HTMLResponse(html, status_code=status_code)


def create_site(secret_key: str) -> FastAPI:
    """The site itself, without the gate."""
    site = FastAPI()
    site.add_middleware(SessionMiddleware, secret_key=secret_key, session_cookie="session", same_site="lax")

    @site.get("/")
    async def home(request: Request) -> HTMLResponse:
        links = "".join(f'<li><a href="/articles/{n}">{escape(title)}</a></li>' for n, (title, _) in ARTICLES.items())
        return _page(request, "Articles", f"<ul>{links}</ul>")

    @site.get("/articles/{article_id}")
    async def article(request: Request, article_id: int) -> HTMLResponse:
        if article_id not in ARTICLES:
            raise HTTPException(status_code=404)
        title, text = ARTICLES[article_id]
        return _page(request, title, f"<p>{escape(text)}</p>")

    @site.get("/login")
    async def login_form(request: Request) -> HTMLResponse:
        return _login_page(request)

    @site.post("/login", response_model=None)
    async def login(request: Request) -> HTMLResponse | RedirectResponse:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        username, password = form.get("username", [""])[0], form.get("password", [""])[0]
        expected = USERS.get(username)
        if expected is None or not hmac.compare_digest(password.encode(), expected.encode()):
            return _login_page(request, "Wrong user name or password.", 401)
        request.session["user"] = username
        return RedirectResponse("/", status_code=303)

    @site.post("/logout")
    async def logout(request: Request) -> RedirectResponse:
        request.session.clear()
        return RedirectResponse("/", status_code=303)

    return site


def _login_page(request: Request, error: str = "", status_code: int = 200) -> HTMLResponse:
    form = (
        '<form method="post" action="/login"><input name="username">'
        '<input name="password" type="password"><button>Log in</button></form>'
    )
    if error:
        form = f"<p>{escape(error)}</p>{form}"
    return _page(request, "Log in", form, status_code)


def create_app(cache_dir: str | None = None, secret_key: str | None = None) -> CrawlerGateMiddleware:
    """The site wrapped in the gate; ``cache_dir`` (else ``CRAWLERGATE_L2_CACHE_DIR``) holds the stored pages."""
    # One key for every worker process, or a session made by one is refused by the others.
    site = create_site(secret_key or os.environ.get("EXAMPLE_SECRET_KEY") or secrets.token_hex(32))
    settings = load_settings(overrides={"l2.cache_dir": cache_dir} if cache_dir else None)
    return CrawlerGateMiddleware(site, settings=settings)
