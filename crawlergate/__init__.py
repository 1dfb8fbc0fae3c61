"""crawlergate: serve crawlers from a two-level cache of guest pages, so they stop overloading dynamic sites."""

from __future__ import annotations

__version__ = "0.1.0"

from crawlergate.adapters.asgi import CrawlerGateMiddleware  # noqa: E402
from crawlergate.adapters.proxy import create_app  # noqa: E402
from crawlergate.adapters.wsgi import CrawlerGateWSGI  # noqa: E402
from crawlergate.config import Settings, load_settings  # noqa: E402

__all__ = ["CrawlerGateMiddleware", "CrawlerGateWSGI", "Settings", "__version__", "create_app", "load_settings"]
