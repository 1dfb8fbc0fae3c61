"""The gate's commands: serve, check, stats, warm, regenerate, invalidate."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from crawlergate.commands.common import (
    EXIT_FAILURE,
    EXIT_OK,
    TOKEN_HELP,
    add_settings_flags,
    add_site_flags,
    flag_overrides,
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    settings_of,
    write_json,
    write_text,
)
from crawlergate.errors import CrawlerGateError
from crawlergate.progress import Progress

# The stats' L1 backends (their class names in the JSON) as serve's start line names them.
_L1_NAMES = {"MemoryStore": "embedded LRU", "MemcachedStore": "memcached"}


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The sub-commands of this family, added to the top parser's."""
    serve = commands.add_parser(
        "serve",
        help="run the standalone proxy in front of a site",
        description="Run crawlergate as a reverse proxy in front of ORIGIN: crawlers are answered from the cache, "
        "everyone else is forwarded.",
    )
    add_site_flags(serve)
    serve.add_argument("--host", help="address to listen on (server.host, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (server.port, default 8080)")
    serve.add_argument("--workers", type=positive_int, help="worker processes (server.workers, default 1)")
    add_settings_flags(serve, cache=True)
    serve.set_defaults(handler=_run_serve)

    check = commands.add_parser(
        "check",
        help="fetch one page as a guest fill would, and say whether it would be stored",
        description="Fetch URL exactly as the gate's guest fill would (through the same proxy, as an outside "
        "visitor of the public URL) and print whether and for how long it would be stored, what guest mode "
        "stores it despite, and every reason it would not be stored. Exit 0: stored; 1: not stored.",
    )
    check.add_argument("url", help="a full URL (https://forum.example/t/1), or a path on --origin (/t/1)")
    add_site_flags(check)
    add_settings_flags(check)
    check.add_argument("--strict", action="store_true", help="judge as storage mode rfc9111 (cache.storage_mode)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(handler=_run_check)

    stats = commands.add_parser(
        "stats",
        help="the live figures of a running gate, in the terminal",
        description="Fetch a running gate's /_crawlergate/stats and show requests, hit ratios and TTFB per class.",
    )
    stats.add_argument("--url", required=True, help="the gate's base URL, e.g. http://127.0.0.1:8080")
    stats.add_argument("--token", default=os.environ.get("CRAWLERGATE_ADMIN_TOKEN", ""), help=TOKEN_HELP)
    stats.add_argument(
        "--watch",
        type=positive_float,
        metavar="SECONDS",
        help="refresh every SECONDS until Ctrl-C (default: show once)",
    )
    stats.add_argument("--json", action="store_true", help="print the raw JSON")
    stats.add_argument(
        "--host", help="one of several sites behind the gate (its Host; default: every site's figures and totals)"
    )
    stats.add_argument("--prefix", default="/_crawlergate", help="the admin prefix (admin.prefix)")
    stats.set_defaults(handler=_run_stats)

    warm = commands.add_parser(
        "warm",
        help="fill L2 for a new deployment from a sitemap, a URL file or a log",
        description="Fetch every cacheable page of a sitemap (or an index of sitemaps), a file of URLs, or an "
        "access log's GET requests, as the gate's guest fills do, and store it in L2 (and L1). Pages L2 "
        "holds are skipped, so an interrupted warm resumes. Takes serve's settings flags.",
    )
    source = warm.add_mutually_exclusive_group(required=True)
    source.add_argument("--sitemap", metavar="URL", help="a sitemap or sitemap index URL")
    source.add_argument("--urls", type=Path, metavar="FILE", help="one URL or /path?query a line")
    source.add_argument("--log", type=Path, metavar="FILE", help="an access log: its successful GET requests")
    warm.add_argument("--concurrency", type=positive_int, default=8, help="fetches at once (default 8)")
    warm.add_argument("--rate", type=float, default=0.0, help="fetches a second at most (default: no limit)")
    warm.add_argument("--json", type=Path, metavar="FILE", help="also write the summary as JSON")
    add_site_flags(warm)
    add_settings_flags(warm, cache=True)
    warm.set_defaults(handler=_run_warm)

    regenerate = commands.add_parser(
        "regenerate",
        help="fetch changed pages again now, within the origin's budget",
        description="Run one regeneration pass now: fetch the pages marked changed (default), every stored page "
        "(--all) or the given URLs as the gate's guest fills do, most wanted by crawlers first, within the "
        "[regenerate] budget (concurrency, rate, pages, time). Takes serve's settings flags, so it acts on the "
        "caches of a running gate; one pass at a time (the scheduled window waits for it, and it for the window).",
    )
    regenerate.add_argument("urls", nargs="*", metavar="URL", help="pages to fetch again, as /path?query or full URLs")
    chosen = regenerate.add_mutually_exclusive_group()
    chosen.add_argument("--dirty", action="store_true", help="the pages marked changed (the default)")
    chosen.add_argument("--all", action="store_true", help="every page the cache holds")
    regenerate.add_argument(
        "--revalidate",
        action="store_true",
        help="then re-fetch pages with no change signal by their optimal rates, as the scheduled window does",
    )
    regenerate.add_argument(
        "--concurrency", type=positive_int, help="fetches at once (regenerate.concurrency, default 2)"
    )
    regenerate.add_argument(
        "--rate", type=non_negative_float, help="fetches a second, 0: no limit (regenerate.rate, default 10)"
    )
    regenerate.add_argument(
        "--origin-share",
        type=fraction,
        help="the share of time the origin may spend on the pass, 0: no limit (regenerate.origin_share, default 0.05)",
    )
    regenerate.add_argument(
        "--max-pages", type=non_negative_int, help="pages at most, 0: no limit (regenerate.max_pages, default 0)"
    )
    regenerate.add_argument(
        "--max-seconds",
        type=positive_float,
        help="start no fetch after this long (regenerate.max_seconds, default 3600)",
    )
    regenerate.add_argument("--json", type=Path, metavar="FILE", help="also write the summary as JSON")
    add_site_flags(regenerate)
    add_settings_flags(regenerate, cache=True)
    regenerate.set_defaults(handler=_run_regenerate)

    invalidate = commands.add_parser(
        "invalidate",
        help="mark pages changed on a running gate (served until regenerated)",
        description="Mark stored pages changed on a running gate: crawlers keep getting the stored copy until it "
        "is regenerated. Needs the admin token (CRAWLERGATE_ADMIN_TOKEN or --token).",
    )
    invalidate.add_argument("urls", nargs="*", metavar="URL", help="a page, as /path?query or a full URL")
    invalidate.add_argument(
        "--pattern",
        action="append",
        default=[],
        help="pages whose /path?query matches; * is any run (repeatable; default: none)",
    )
    invalidate.add_argument("--url", dest="gate", required=True, help="the gate's base URL, e.g. http://127.0.0.1:8080")
    invalidate.add_argument("--token", default=os.environ.get("CRAWLERGATE_ADMIN_TOKEN", ""), help=TOKEN_HELP)
    invalidate.add_argument("--prefix", default="/_crawlergate", help="the admin prefix (admin.prefix)")
    invalidate.add_argument(
        "--host",
        help="one of several sites behind the gate (its Host; default: the host of full URLs, else the gate's)",
    )
    invalidate.set_defaults(handler=_run_invalidate)


def _run_serve(args: argparse.Namespace) -> int:
    from crawlergate.adapters.server import run_proxy

    return run_proxy(settings_of(args, flag_overrides(args)))


def _run_check(args: argparse.Namespace) -> int:
    import asyncio

    from crawlergate.adapters.server import check_site_settings
    from crawlergate.check import check_page

    settings = settings_of(args, flag_overrides(args)).one_site()
    check_site_settings(settings)
    report = asyncio.run(check_page(settings, args.url))
    if args.json:
        write_json("-", report.as_json())
    else:
        print(report.text())
    return EXIT_OK if report.stored else EXIT_FAILURE


def _run_stats(args: argparse.Namespace) -> int:

    import httpx

    url = _gate_base(args.url) + args.prefix + "/stats"
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    if args.host:
        headers["host"] = args.host
    while True:
        try:
            response = httpx.get(url, headers=headers, timeout=5)
        except httpx.HTTPError as exc:
            raise CrawlerGateError(f"Cannot reach {url}: {str(exc).rstrip('.')}.") from None
        if response.status_code != 200:
            raise CrawlerGateError(f"{url} answered {_refusal(response)}")
        data = _admin_json(response, url, "crawler")
        print(json.dumps(data, indent=2, sort_keys=True) if args.json else _format_stats(data), flush=True)
        if not args.watch:
            return EXIT_OK
        time.sleep(args.watch)
        print()


def _class_rows(data: dict[str, Any]) -> list[str]:
    """Requests, hits and TTFB per class, under a header."""
    # Hits a front server answered from the published tree: a column of their own when there are any.
    direct = any(data.get(kind, {}).get("direct_hits", 0) for kind in ("crawler", "suspect", "human"))
    head = f"{'':<8}{'requests':>10}{'L1 hits':>10}{'L2 hits':>10}" + (f"{'direct':>9}" if direct else "")
    lines = [head + f"{'misses':>9}{'stale':>7}{'passes':>9}{'hit ratio':>11}{'TTFB p50':>10}{'p99':>9}{'mean ms':>9}"]
    for kind in ("crawler", "suspect", "human"):
        row = data.get(kind, {})
        ttfb = row.get("ttfb_ms")  # none in several sites' totals: percentiles do not add up
        times = (
            f"{ttfb.get('p50', 0):>10.2f}{ttfb.get('p99', 0):>9.2f}{ttfb.get('mean', 0):>9.2f}"
            if isinstance(ttfb, dict)
            else f"{'-':>10}{'-':>9}{'-':>9}"
        )
        lines.append(
            f"{kind:<8}{row.get('requests', 0):>10,}{row.get('l1_hits', 0):>10,}{row.get('l2_hits', 0):>10,}"
            + (f"{row.get('direct_hits', 0):>9,}" if direct else "")
            + f"{row.get('misses', 0):>9,}{row.get('stale', 0):>7,}{row.get('passes', 0):>9,}"
            f"{row.get('hit_ratio', 0):>11.1%}{times}"
        )
    return lines


def _format_stats(data: dict[str, Any]) -> str:
    sites = data.get("sites")
    if isinstance(sites, dict):  # several sites behind one serve: their totals, then each site
        parts = [f"all {len(sites)} sites\n" + "\n".join(_class_rows(data))]
        parts += [f"{name}\n" + _format_stats(site) for name, site in sites.items()]
        return "\n\n".join(parts)
    lines = _class_rows(data)
    origin, share = data.get("origin", {}), data.get("crawler_share", {})
    origin_s = origin.get("seconds", {})
    prefetches, evictions = data.get("prefetches", {}), data.get("evictions", {})
    l1, l2 = data.get("l1", {}), data.get("l2", {})
    l1_fill = f", {l1['used_bytes'] / 2**20:.1f} of {l1['max_bytes'] / 2**20:.0f} MiB" if "max_bytes" in l1 else ""
    l1_name = _L1_NAMES.get(l1.get("backend", ""), l1.get("backend", "?"))
    l1_fill += "".join(f", {_l1_server(name, server)}" for name, server in l1.get("servers", {}).items())
    lines += [
        f"crawler share: {share.get('requests', 0):.1%} of requests, {share.get('origin_time', 0):.1%} of origin time; "
        f"origin time saved by hits {data.get('origin_time_saved_s', 0):,.1f} s",
        f"origin: {origin.get('requests', 0):,} guest fills ({origin.get('errors', 0):,} errors), "
        f"p50 {origin.get('ttfb_ms', {}).get('p50', 0):,.2f} ms; origin time for crawlers "
        f"{origin_s.get('crawler', 0):,.1f} s, for humans {origin_s.get('human', 0):,.1f} s",
        f"L1 {l1_name}{l1_fill}; L2 {l2.get('pages', 0):,} pages, {l2.get('bytes', 0) / 1e6:.1f} MB"
        + (f" (loading the folder: {l2['loading']:.0%})" if "loading" in l2 else "")
        + "; "
        f"evicted {evictions.get('l1', 0):,} (L1), {evictions.get('l2', 0):,} (L2); prefetches "
        f"{prefetches.get('issued', 0):,} ({prefetches.get('useful', 0):,} useful); "
        f"changed pages {data.get('dirty', 0):,}",
    ]
    evidence, valve = data.get("evidence", {}), data.get("valve", {})
    if evidence or valve:
        reasons = sorted(evidence.get("reasons", {}).items(), key=lambda item: -item[1])[:4]
        refused = valve.get("refused", {})
        lines.append(
            f"suspects: {evidence.get('suspects', 0):,} requests by evidence"
            + (f" ({', '.join(f'{name} {count:,}' for name, count in reasons)})" if reasons else "")
            + f"; claimed search engines {evidence.get('verified_claimants', 0):,} verified, "
            f"{evidence.get('unverified_claimants', 0):,} unverified"
        )
        lines.append(
            f"overload valve: {'shedding' if valve.get('shedding') else 'open'} in this process "
            f"({valve.get('in_flight', 0)} of {valve.get('max_in_flight', 0)} requests to the site in flight); "
            f"refused {refused.get('valve', 0):,} crawler misses, {refused.get('cache_only', 0):,} by cache-only"
        )
    families = sorted(data.get("families", {}).items(), key=lambda item: -item[1]["requests"])[:5]
    if families:
        shown = [f"{name} {family['requests']:,} ({family['hits'] / family['requests']:.0%} hits)"
                 for name, family in families]  # fmt: skip
        lines.append("top crawler families: " + "; ".join(shown))
    regeneration = data.get("regeneration")
    if regeneration and "error" in regeneration:
        lines.append(f"regeneration: unavailable ({regeneration['error']})")
    elif regeneration:
        last = regeneration.get("last_window") or {}
        next_at = regeneration.get("next_window")
        next_text = time.strftime("%Y-%m-%d %H:%M", time.localtime(next_at)) if next_at else "none"
        last_text = (
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(last['start']))}, {last.get('pages', 0):,} pages"
            if last.get("start")
            else "none yet"
        )
        lines.append(
            f"regeneration: window {regeneration.get('window')}, next {next_text}, last {last_text}"
            f"{', running now' if regeneration.get('running') else ''}"
        )
    lines.append(f"{data.get('processes', 1)} process(es), up {data.get('uptime_s', 0):,.0f} s")
    return "\n".join(lines)


def _run_warm(args: argparse.Namespace) -> int:
    import asyncio

    from crawlergate.adapters.proxy import create_app
    from crawlergate.warm import file_urls, log_urls, sitemap_urls, warm

    settings = settings_of(args, flag_overrides(args)).one_site()
    if args.rate < 0:
        raise CrawlerGateError("--rate must be 0 (no limit) or a positive number of fetches a second.")

    async def run() -> dict[str, Any]:
        if args.sitemap:
            urls = await sitemap_urls(args.sitemap)
        elif args.urls:
            urls = file_urls(args.urls)
        else:
            urls = list(log_urls(args.log))
        gate = create_app(settings)
        gate.start()
        try:
            with Progress("warming L2", total=len(urls), unit=" pages") as progress:
                summary = await warm(
                    gate,
                    urls,
                    concurrency=args.concurrency,
                    rate=args.rate,
                    on_progress=lambda done, total: progress.update(done),
                )
        finally:
            await gate.aclose()
        return summary.as_dict()

    data = asyncio.run(run())
    not_stored = ", ".join(f"{reason} {count:,}" for reason, count in sorted(data["not_stored"].items())) or "none"
    print(
        f"warm: {data['pages']:,} pages: {data['stored']:,} stored ({data['bytes_stored'] / 1e6:.1f} MB gzip), "
        f"{data['skipped']:,} already stored, {data['errors']:,} origin errors, not stored: {not_stored}; "
        f"{data['not_cacheable']:,} URLs not cacheable; {data['seconds']:.1f} s, "
        f"origin time {data['origin_seconds']:.1f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(data, indent=2, sort_keys=True))
    return EXIT_OK


def _run_regenerate(args: argparse.Namespace) -> int:
    import asyncio

    from crawlergate.adapters.proxy import create_app
    from crawlergate.regenerate.regenerator import PassSummary, Selection
    from crawlergate.wiring import DIRTY_INDEX_FILE

    overrides = flag_overrides(args)
    for flag in ("concurrency", "rate", "origin_share", "max_pages", "max_seconds"):
        if getattr(args, flag) is not None:
            overrides[f"regenerate.{flag}"] = getattr(args, flag)
    settings = settings_of(args, overrides).one_site()
    if args.all and args.urls:
        raise CrawlerGateError("Give --all or URLs, not both.")
    if not (settings.cache_dir / DIRTY_INDEX_FILE).is_file():
        raise CrawlerGateError(
            f"No cache at {settings.cache_dir} (it has no {DIRTY_INDEX_FILE}): give the --cache-dir serve uses."
        )
    if args.json and not os.access(args.json.parent, os.W_OK):
        raise CrawlerGateError(f"Cannot write the summary to {args.json}: its folder is missing or read-only.")
    selection = Selection(
        dirty=args.dirty or not (args.all or args.urls),
        all_pages=args.all,
        urls=tuple(args.urls),
        revalidate=args.revalidate,
    )

    async def run() -> PassSummary:
        gate = create_app(settings)
        gate.start()
        job = gate.regeneration
        try:
            holder = await asyncio.to_thread(job.lease.take)
            if holder is not None:
                raise CrawlerGateError(f"Another regeneration pass is running ({holder}); try again when it ends.")
            try:
                with Progress("regenerating", total=0, unit=" pages") as progress:

                    def show(done: int, total: int) -> None:
                        progress.total = total
                        progress.update(done)

                    summary = await job.regenerator.run(selection, on_progress=show)
                await asyncio.to_thread(job.state.record_window, summary.as_dict(), scheduled_start=None)
            finally:
                await asyncio.to_thread(job.lease.release)
        finally:
            await gate.aclose()
        return summary

    summary = asyncio.run(run())
    skipped = f"; {summary.not_cacheable:,} of the URLs given are not cacheable" if summary.not_cacheable else ""
    print(
        f"regenerate: {_count(summary.pages, 'page')} tried: {summary.changed:,} changed, {summary.unchanged:,} "
        f"unchanged (same ETag), {summary.gone:,} now 404/410, {summary.removed:,} removed, "
        f"{summary.not_stored:,} not storable, {summary.errors:,} origin errors; {summary.revalidated:,} "
        f"revalidated ({summary.revalidations_changed:,} had changed){skipped}; "
        f"{_count(summary.remaining, 'marked page')} wait for the next window; {summary.seconds:.1f} s "
        f"({summary.stopped}), origin time {summary.origin_seconds:.1f} s"
    )
    for sample in summary.error_samples:
        print(f"  error: {sample}")
    if args.json:
        write_text(args.json, json.dumps(summary.as_dict(), indent=2, sort_keys=True))
    if summary.stopped == "pages gone":
        print(
            f"crawlergate: stopped: {summary.gone + summary.removed} of {summary.pages} stored pages now answer "
            "404 or 410; is --origin the site?",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    if summary.pages and summary.errors == summary.pages:
        print("crawlergate: the origin answered none of the pass's requests", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def _l1_server(name: str, server: dict[str, Any]) -> str:
    """One memcached server of L1 as ``stats`` shows it."""
    if server.get("up"):
        used, most = server.get("used_bytes", 0) / 2**20, server.get("max_bytes", 0) / 2**20
        return f"{name} {used:.1f} of {most:.0f} MiB, {server.get('evictions', 0):,} evicted"
    if "skipped_s" in server:
        return f"{name} down (tried again in {server['skipped_s']:.0f} s)"
    return f"{name} down ({server.get('error', '?')})"


def _gate_base(url: str) -> str:
    """The gate's address as given, ``http://`` added when it names no scheme (``127.0.0.1:8080``)."""
    return (url if "://" in url else "http://" + url).rstrip("/")


def _admin_json(response: Any, url: str, field: str) -> dict[str, Any]:
    """An admin endpoint's JSON object holding ``field``; a page of anything else (the site itself, a proxy's
    error page) is a wrong address, said in one sentence."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict) or field not in data:
        raise CrawlerGateError(
            f"{url} answered 200 with something other than crawlergate's JSON: is it the gate's address "
            "(and --prefix its admin prefix)?"
        )
    return data


def _refusal(response: Any) -> str:
    """An admin endpoint's refusal in one line: its status and its text (the gate's JSON) on one line; of a page (a
    site's or a proxy's 404, not the gate's), what that means."""
    if "html" in response.headers.get("content-type", ""):
        return f"{response.status_code} with a web page: is it the gate's address (and --prefix its admin prefix)?"
    return f"{response.status_code}: {' '.join(response.text.split())[:200]}"


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def _page_host(page: str) -> str | None:
    """The host a page argument names (None for a path); raises CrawlerGateError for neither a path nor a URL."""
    try:
        parts = urlsplit(page)
    except ValueError as exc:
        raise CrawlerGateError(f"'{page}' is not a URL: {exc}.") from None
    if parts.scheme in ("http", "https") and parts.netloc:
        return parts.netloc
    if not parts.scheme and page.startswith("/"):
        return None
    raise CrawlerGateError(f"'{page}' is neither a path (/t/1.html) nor an http:// or https:// URL.")


def _run_invalidate(args: argparse.Namespace) -> int:
    import httpx

    if not args.urls and not args.pattern:
        raise CrawlerGateError("Give the pages to mark: URL arguments, --pattern P, or both.")
    if not args.token:
        raise CrawlerGateError("invalidate needs the gate's admin token: set CRAWLERGATE_ADMIN_TOKEN or give --token.")
    url = _gate_base(args.gate) + args.prefix + "/invalidate"
    # With several sites behind the gate, each site marks its own pages: full URLs go to the site they name.
    by_host: dict[str | None, list[str]] = {}
    for page in args.urls:
        by_host.setdefault(args.host or _page_host(page), []).append(page)
    if args.pattern or not by_host:
        by_host.setdefault(args.host, [])
    marked = 0
    for host, pages in by_host.items():
        headers = {"authorization": f"Bearer {args.token}"} | ({"host": host} if host else {})
        patterns = args.pattern if host == args.host else []
        try:
            response = httpx.post(url, json={"urls": pages, "patterns": patterns}, headers=headers, timeout=30)
        except httpx.HTTPError as exc:
            raise CrawlerGateError(f"Cannot reach {url}: {str(exc).rstrip('.')}.") from None
        if response.status_code != 200:
            site = f" (Host {host})" if host else ""
            raise CrawlerGateError(f"{url}{site} answered {_refusal(response)}")
        marked += _admin_json(response, url, "marked")["marked"]
    print(f"marked {marked:,} page(s) changed")
    return EXIT_OK
