"""The gate's settings, shared by wsgi.py and asgi.py."""

from __future__ import annotations

from typing import Any

from crawlergate import Settings, load_settings


def gate_settings(cache_dir: str | None = None) -> Settings:
    """``crawlergate.toml`` (``CRAWLERGATE_CONFIG``) and ``CRAWLERGATE_*`` variables, with the Django site profile:
    never cache /admin/, /accounts/, /login, /logout, password views (rules/sites/django.toml).
    ``cache_dir`` overrides the L2 folder (else ``CRAWLERGATE_L2_CACHE_DIR``)."""
    overrides: dict[str, Any] = {"cache.sites": ["django"]}
    if cache_dir:
        overrides["l2.cache_dir"] = cache_dir
    return load_settings(overrides=overrides)
