"""A Flask site inside CrawlerGateWSGI.

Public article pages, a login form that puts the user in Flask's signed ``session`` cookie, and a
greeting on every page ("Hello, alice" once logged in). Crawlers get the guest pages from the
gate's cache; people, and anyone with the session cookie, always get the live site.

    flask --app 'examples.flask_app:create_app()' run
    gunicorn 'examples.flask_app:create_app()'

The gate wraps ``app.wsgi_app``, Flask's own place for WSGI middleware, so the Flask object stays
the application (``flask run``, ``app.test_client()``). Its settings come from ``crawlergate.toml``
named by ``CRAWLERGATE_CONFIG`` and from ``CRAWLERGATE_*`` variables; ``create_app``'s
``cache_dir`` overrides the L2 folder.
"""

from __future__ import annotations

import hmac
import os
import secrets

from flask import Flask, abort, redirect, render_template_string, request, session
from werkzeug.wrappers import Response

from crawlergate import CrawlerGateWSGI, load_settings

ARTICLES = {
    1: ("Why crawlers cost so much", "They fetch every dynamic page, day and night."),
    2: ("Guest pages for crawlers", "A crawler never needs a page made for one person."),
    3: ("Two cache levels", "Memory first, then gzip files on disk."),
}
# A demo account; a real site checks a password hash in its user table.
USERS = {"alice": "wonderland"}

PAGE = """<!doctype html><html><head><title>{{ title }}</title></head><body>
<header><a href="/">Home</a>
{% if session.user %}Hello, {{ session.user }}
<form method="post" action="/logout"><button>Log out</button></form>
{% else %}Hello, guest. <a href="/login">Log in</a>{% endif %}
</header><main><h1>{{ title }}</h1>
{% if articles %}<ul>{% for n, (heading, _) in articles %}<li><a href="/articles/{{ n }}">{{ heading }}</a></li>
{% endfor %}</ul>{% endif %}
{% if text %}<p>{{ text }}</p>{% endif %}
{% if form %}{% if error %}<p>{{ error }}</p>{% endif %}<form method="post" action="/login">
<input name="username"><input name="password" type="password"><button>Log in</button></form>{% endif %}
</main></body></html>"""


def create_site(secret_key: str) -> Flask:
    """The site itself, without the gate."""
    site = Flask(__name__)
    site.secret_key = secret_key

    @site.get("/")
    def home() -> str:
        return render_template_string(PAGE, title="Articles", articles=ARTICLES.items())

    @site.get("/articles/<int:article_id>")
    def article(article_id: int) -> str:
        if article_id not in ARTICLES:
            abort(404)
        title, text = ARTICLES[article_id]
        return render_template_string(PAGE, title=title, text=text)

    @site.get("/login")
    def login_form() -> str:
        return render_template_string(PAGE, title="Log in", form=True)

    @site.post("/login")
    def login() -> Response | tuple[str, int]:
        username, password = request.form.get("username", ""), request.form.get("password", "")
        expected = USERS.get(username)
        if expected is None or not hmac.compare_digest(password.encode(), expected.encode()):
            return render_template_string(PAGE, title="Log in", form=True, error="Wrong user name or password."), 401
        session["user"] = username
        return redirect("/", code=303)

    @site.post("/logout")
    def logout() -> Response:
        session.clear()
        return redirect("/", code=303)

    return site


def create_app(cache_dir: str | None = None, secret_key: str | None = None) -> Flask:
    """The site with the gate around its WSGI app; ``cache_dir`` (else ``CRAWLERGATE_L2_CACHE_DIR``) holds the
    stored pages. The gate is ``app.extensions["crawlergate"]`` (``close()`` it at shutdown)."""
    # One key for every worker process, or a session made by one is refused by the others.
    app = create_site(secret_key or os.environ.get("EXAMPLE_SECRET_KEY") or secrets.token_hex(32))
    settings = load_settings(overrides={"l2.cache_dir": cache_dir} if cache_dir else None)
    gate = CrawlerGateWSGI(app.wsgi_app, settings=settings)
    app.wsgi_app = gate  # type: ignore[method-assign]
    app.extensions["crawlergate"] = gate
    return app
