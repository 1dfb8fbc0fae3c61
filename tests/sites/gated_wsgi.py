"""A WSGI site inside CrawlerGateWSGI, for gunicorn: ``tests.sites.gated_wsgi:application``.

``SITE_WSGI_APP`` names the site as ``module:attribute`` (e.g. ``tests.sites.trac_wsgi:application``);
the gate's settings come from ``CRAWLERGATE_*`` variables (``CRAWLERGATE_SERVER_PUBLIC_URL``,
``CRAWLERGATE_L2_CACHE_DIR``, ...), as a deployment would set them.
"""

from __future__ import annotations

import importlib
import os

from crawlergate import CrawlerGateWSGI, load_settings

_module, _, _attribute = os.environ["SITE_WSGI_APP"].partition(":")
site = getattr(importlib.import_module(_module), _attribute or "application")

application = CrawlerGateWSGI(site, settings=load_settings(None, os.environ))
application.start()
