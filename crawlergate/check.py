"""``crawlergate check URL``: fetch one page exactly as a guest fill would, and say whether it would be stored.

What redbot and ``varnishlog`` tell operators, for crawlergate's own rules: the key, the answer,
how long the page would live, everything guest mode stored it despite, and every reason it would
not be stored. The fill goes through the same ReverseProxy and guest identity as ``serve``'s.

    report = asyncio.run(check_page(settings, "https://forum.example/t/1"))
    print(report.text())
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from crawlergate.adapters.inapp import AsgiOrigin
from crawlergate.adapters.proxy import ReverseProxy
from crawlergate.config import Settings
from crawlergate.errors import ConfigError, OriginError
from crawlergate.gate.origin import OriginResponse, PageTooLarge, PassedOn, PublicSite
from crawlergate.gate.storable import StoragePolicy
from crawlergate.keys import KeyMaker


@dataclass(slots=True)
class CheckReport:
    """What ``check`` found about one URL."""

    url: str
    fetched: str
    public: str
    key: str | None
    status: int | None = None
    content_type: str = ""
    body_bytes: int = 0
    site_gzip_bytes: int | None = None
    elapsed_ms: float = 0.0
    ttl_seconds: float = 0.0
    storage_mode: str = "guest"
    reasons: list[tuple[str, str]] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)
    kept_headers: list[str] = field(default_factory=list)
    public_url_guessed: bool = False
    # The answer's X-Crawlergate: a gate answered (the middleware in the app, or serve), not the site itself.
    gate_outcome: str = ""

    @property
    def stored(self) -> bool:
        return not self.reasons

    def as_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "fetched": self.fetched,
            "public_url": self.public,
            "key": self.key,
            "status": self.status,
            "content_type": self.content_type,
            "body_bytes": self.body_bytes,
            "site_gzip_bytes": self.site_gzip_bytes,
            "elapsed_ms": round(self.elapsed_ms, 1),
            "storage_mode": self.storage_mode,
            "stored": self.stored,
            "ttl_seconds": self.ttl_seconds,
            "reasons": [{"reason": label, "detail": detail} for label, detail in self.reasons],
            "stored_despite": self.set_aside if self.stored else [],
            "kept_headers": self.kept_headers,
            "gate_outcome": self.gate_outcome or None,
        }

    def text(self) -> str:
        lines = [f"fetched {self.fetched} as a guest of {self.public}"]
        if self.public_url_guessed:
            lines.append(
                f"note: no --public-url (server.public_url): fills ask as guests of {self.public}; give the address "
                "crawlers use, as serve needs it too"
            )
        if self.gate_outcome:
            lines.append(
                f"warning: a crawlergate gate answered (X-Crawlergate: {self.gate_outcome}), not the site itself: "
                "what follows judges the gate's copy. Give --origin the application without the gate (its own "
                "port, or the app run without the middleware)"
            )
        if self.status is not None:
            gzip_note = f", the site's gzip {self.site_gzip_bytes:,} bytes" if self.site_gzip_bytes is not None else ""
            lines.append(
                f"answer:  {self.status} {self.content_type or '(no content type)'}, "
                f"{self.body_bytes:,} bytes{gzip_note}, {self.elapsed_ms:.0f} ms"
            )
        lines.append(f"key:     {self.key or '(none: not cacheable)'}")
        if self.stored:
            lines.append(f"stored:  yes, for {_duration(self.ttl_seconds)} (storage mode {self.storage_mode})")
        else:
            lines.append(f"stored:  no (storage mode {self.storage_mode})")
            lines += [f"  {label}: {detail}" for label, detail in self.reasons]
        if self.set_aside and self.stored:
            lines.append("stored despite (a stored page only ever answers requests without a session):")
            lines += [f"  {item}" for item in self.set_aside]
        if self.kept_headers:
            lines.append("headers kept with the page: " + ", ".join(self.kept_headers))
        return "\n".join(lines)


async def check_page(settings: Settings, url: str) -> CheckReport:
    """Fetch ``url`` (a full URL, or a path on ``server.origin``) as a fill would, and judge the answer."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed IPv6 bracket, a bad port
        raise ConfigError(f"'{url}' is not a URL: {exc}.") from None
    if parts.scheme and parts.scheme not in ("http", "https"):
        raise ConfigError(f"'{url}' is not an http:// or https:// URL or a path such as /wiki/Start.")
    if not parts.scheme and not url.startswith("/"):
        raise ConfigError(f"'{url}' is neither a URL nor a path: write https://site/page or /page.")
    given_base = f"{parts.scheme}://{parts.netloc}" if parts.scheme else ""
    origin = settings.server.origin or given_base
    if not origin:
        raise ConfigError(f"'{url}' is a path: give --origin URL (or server.origin) to say which site to ask.")
    public = settings.server.public_url or given_base or origin
    raw_path = (parts.path or "/").encode("utf-8", "surrogateescape")
    query = parts.query.encode("utf-8", "surrogateescape")
    keys = KeyMaker.from_settings(settings)
    key = keys.key_for(raw_path, query)
    target = key.target if key is not None else url[len(given_base) :] or "/"
    report = CheckReport(
        url=url,
        fetched=origin.rstrip("/") + target,
        public=public,
        key=key.target if key is not None else None,
        storage_mode=settings.cache.storage_mode,
        public_url_guessed=not settings.server.public_url,
    )
    if key is None:
        report.reasons.append(("excluded", keys.why_not_cacheable(raw_path, query)))
    proxy = ReverseProxy(
        origin,
        timeout_s=settings.cache.fill_timeout_seconds,
        trusted_proxies=settings.server.trusted_proxies,
        public_url=public,
        forward_host=settings.server.forward_host,
    )
    fetcher = AsgiOrigin(
        proxy,
        public=PublicSite.from_url(public),
        fill_client_address=settings.server.fill_client_address,
        timeout_s=settings.cache.fill_timeout_seconds,
        max_bytes=settings.l2.page_max_bytes,
    )
    started = time.perf_counter()
    try:
        response = await fetcher.fetch_guest(target)
    except PageTooLarge as exc:
        report.reasons.append(("too-big", f"{exc} (l2.page_max_bytes)"))
        return report
    except PassedOn as exc:
        report.reasons.append((exc.reason, str(exc)))
        return report
    except OriginError as exc:
        report.reasons.append(("origin-error", str(exc)))
        return report
    finally:
        report.elapsed_ms = (time.perf_counter() - started) * 1000
        await proxy.aclose()
    _judge(report, response, StoragePolicy(settings.cache, keys), target)
    return report


def _judge(report: CheckReport, response: OriginResponse, policy: StoragePolicy, target: str) -> None:
    report.status = response.status
    report.content_type = response.header("content-type") or ""
    report.body_bytes = len(response.body)
    report.site_gzip_bytes = len(response.body_gz) if response.body_gz is not None else None
    report.gate_outcome = response.header("x-crawlergate") or ""
    verdict = policy.judge(response, target, now=time.time())
    report.reasons += verdict.reasons
    report.set_aside = list(verdict.set_aside)
    report.ttl_seconds = verdict.ttl_seconds if report.stored else 0.0
    if report.stored:
        page = policy.page(response, verdict, now=time.time())
        report.kept_headers = sorted({name for name, _ in page.headers})


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:g} d"
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
