"""crawlergate: serve crawlers from a two-level cache of guest pages, so they stop overloading dynamic sites."""

from __future__ import annotations

from crawlergate.config import Settings, load_settings

__version__ = "0.1.0"

__all__ = ["Settings", "__version__", "load_settings"]
