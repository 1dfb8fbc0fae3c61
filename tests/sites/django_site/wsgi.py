"""The Django project as a WSGI application: ``tests.sites.django_site.wsgi:application``."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.sites.django_site.settings")
application = get_wsgi_application()
