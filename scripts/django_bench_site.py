"""A one-file Django site for scripts/bench_proxy.py: one page that costs about 2 ms, with a CSRF form.

Sessions and CSRF are on, as in a real project, so the page sends ``Set-Cookie: csrftoken`` and
``Vary: Cookie``. Run it with gunicorn: ``gunicorn --chdir scripts django_bench_site:application``.
``BENCH_PAGE_MS`` sets the page's CPU time.
"""

from __future__ import annotations

import os
import time

import django
from django.conf import settings
from django.core.wsgi import get_wsgi_application
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.urls import path

PAGE_MS = float(os.environ.get("BENCH_PAGE_MS", "2"))

settings.configure(
    DEBUG=False,
    SECRET_KEY="bench-only-not-secret",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    USE_X_FORWARDED_HOST=True,
    MIDDLEWARE=[
        "django.middleware.security.SecurityMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
    ],
)
django.setup()


def item(request: HttpRequest, number: int) -> HttpResponse:
    deadline = time.perf_counter() + PAGE_MS / 1000
    while time.perf_counter() < deadline:
        pass
    token = get_token(request)
    body = (
        f"<!doctype html><title>Item {number}</title><h1>Item {number}</h1>"
        + "<p>A description of the item, as a real page would have.</p>" * 40
        + f'<form method="post"><input type="hidden" name="csrfmiddlewaretoken" value="{token}">'
        '<textarea name="comment"></textarea><button>Post</button></form>'
    )
    return HttpResponse(body)


urlpatterns = [path("item/<int:number>/", item)]
application = get_wsgi_application()
