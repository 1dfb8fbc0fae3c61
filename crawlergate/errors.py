"""The crawlergate exception tree.

CrawlerGateError
├── ConfigError       bad settings or rules file: raised at start-up, never per request
├── StoreUnavailable  L1/L2 failure: caught in cache.py, counted, treated as a miss
└── OriginError       origin unreachable, timed out, or refused: mapped from httpx in origin.py
    └── OriginTimeout
"""

from __future__ import annotations


class CrawlerGateError(Exception):
    """Base class of every error crawlergate raises on purpose."""


class ConfigError(CrawlerGateError):
    """Raised when a setting or a rules file is invalid, likely because of a typo in the TOML or environment."""


class StoreUnavailable(CrawlerGateError):
    """Raised when a cache store cannot answer, likely because memcached is down or the disk is full."""


class OriginError(CrawlerGateError):
    """Raised when the origin cannot produce a page, likely because it is down or refused the request."""


class OriginTimeout(OriginError):
    """Raised when the origin did not answer in time, likely because it is overloaded."""
