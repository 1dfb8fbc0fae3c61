"""Settings from the environment.

- ``SITE_DB``: the SQLite file.
- ``SITE_PUBLIC_HOST``: the one Host the site answers (``host:port``), the gate's public address.
  ``ALLOWED_HOSTS`` compares the name only, never the port, so ``PublicHostOnlyMiddleware`` checks the
  whole ``host:port``: a request with any other Host gets 400, as a site behind a real name would.
- ``SITE_SSL_REDIRECT=1``: ``SECURE_SSL_REDIRECT`` on, for a site behind a TLS front.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = "crawlergate-tests-only-not-a-secret-0123456789abcdef"
DEBUG = False
PUBLIC_HOST = os.environ.get("SITE_PUBLIC_HOST", "127.0.0.1:8000")
ALLOWED_HOSTS = [PUBLIC_HOST.rsplit(":", 1)[0]]
USE_X_FORWARDED_HOST = True
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = os.environ.get("SITE_SSL_REDIRECT", "") == "1"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.sites",
    "django.contrib.flatpages",
    "tests.sites.django_site",
]
MIDDLEWARE = [
    "tests.sites.django_site.middleware.PublicHostOnlyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "tests.sites.django_site.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": False,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
            ]
        },
    }
]
WSGI_APPLICATION = "tests.sites.django_site.wsgi.application"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SITE_DB", str(BASE_DIR / "db.sqlite3")),
        "OPTIONS": {"timeout": 20},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
# Quick to check: the tests log in a few times, nobody's real password is here.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
SITE_ID = 1
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = False
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/me/"
LOGOUT_REDIRECT_URL = "/"
# The 5 MB upload goes to a temporary file, not memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django.request": {"handlers": ["console"], "level": "ERROR"},
        "django.security": {"handlers": ["console"], "level": "WARNING"},
    },
}
