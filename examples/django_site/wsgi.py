"""The project as a WSGI application inside CrawlerGateWSGI: ``gunicorn examples.django_site.wsgi``."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from crawlergate import CrawlerGateWSGI
from examples.django_site.gate import gate_settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_site.settings")
django_application = get_wsgi_application()


def create_application(cache_dir: str | None = None) -> CrawlerGateWSGI:
    """Django inside the gate; the gate's ``close()`` finishes its background work and releases its stores."""
    return CrawlerGateWSGI(django_application, settings=gate_settings(cache_dir))


application = create_application()
