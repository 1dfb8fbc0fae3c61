"""The ``crawlergate`` command.

    crawlergate classify "Mozilla/5.0 (compatible; Googlebot/2.1)"
    crawlergate classify --file user-agents.txt
    crawlergate classify --log access.log.gz --json report.json
    crawlergate serve --origin http://127.0.0.1:8000 --port 8080
    crawlergate demo forum --port 8000 / crawlergate demo trace --out forum.log

Every command that takes settings reads ``--config FILE`` and ``CRAWLERGATE_*`` variables.
Errors a user can fix (a bad setting, a missing file) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from crawlergate import __version__
from crawlergate.classify import Classifier
from crawlergate.config import Settings, load_settings
from crawlergate.errors import CrawlerGateError
from crawlergate.progress import Progress
from crawlergate.tools.analyze import crawler_share, format_share, share_as_json
from crawlergate.tools.logparse import PRESETS, LogReader

EXIT_OK = 0
# `check`: the page would not be stored.
EXIT_FAILURE = 1
EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        result: int = args.handler(args)
    except CrawlerGateError as exc:
        print(f"crawlergate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("crawlergate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. `head`) went away; that is not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crawlergate",
        description="Keep search-engine and AI crawlers from overloading a dynamic web site.",
    )
    parser.add_argument("--version", action="version", version=f"crawlergate {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    classify = commands.add_parser(
        "classify",
        help="tell crawler from human user agents, or measure the crawler share of an access log",
        description="Print crawler<TAB>UA or human<TAB>UA for each user agent, in input order; "
        "with --log, the crawler share of a log's requests and server time.",
    )
    classify.add_argument("user_agents", nargs="*", metavar="UA", help="user agents to classify")
    source = classify.add_mutually_exclusive_group()
    source.add_argument("--file", type=Path, help="a file of user agents, one per line ('-' for standard input)")
    source.add_argument("--log", type=Path, help="an access log (plain or gzipped) to summarise")
    classify.add_argument(
        "--format",
        default="auto",
        help=f"log format: auto (detected: nginx/Apache text, JSON lines, W3C), {', '.join(PRESETS)}, json, "
        "json:FIELD=NAME,..., w3c, or an Apache LogFormat / nginx log_format string",
    )
    classify.add_argument("--families", action="store_true", help="add the crawler family and tag as columns")
    classify.add_argument("--top", type=_positive_int, default=10, help="user agents in the --log top list")
    classify.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE ('-' for stdout)")
    _add_settings_flags(classify)
    classify.set_defaults(handler=_run_classify)

    serve = commands.add_parser(
        "serve",
        help="run the standalone proxy in front of a site",
        description="Run crawlergate as a reverse proxy in front of ORIGIN: crawlers are answered from the cache, "
        "everyone else is forwarded.",
    )
    _add_site_flags(serve)
    serve.add_argument("--host", help="address to listen on (server.host, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (server.port, default 8080)")
    serve.add_argument("--workers", type=_positive_int, help="worker processes (server.workers, default 1)")
    _add_settings_flags(serve, cache=True)
    serve.set_defaults(handler=_run_serve)

    check = commands.add_parser(
        "check",
        help="fetch one page as a guest fill would, and say whether it would be stored",
        description="Fetch URL exactly as the gate's guest fill would (through the same proxy, as an outside "
        "visitor of the public URL) and print whether and for how long it would be stored, what guest mode "
        "stores it despite, and every reason it would not be stored. Exit 0: stored; 1: not stored.",
    )
    check.add_argument("url", help="a full URL (https://forum.example/t/1), or a path on --origin (/t/1)")
    _add_site_flags(check)
    _add_settings_flags(check)
    check.add_argument("--strict", action="store_true", help="judge as storage mode rfc9111 (cache.storage_mode)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(handler=_run_check)

    analyze = commands.add_parser(
        "analyze",
        help="characterise an access log: crawler share, daily pattern, off-peak hour, crawler breadth",
        description="The paper's section 2 on any log: crawler share of requests and server time, top user agents, "
        "requests per hour for humans and crawlers, the off-peak hour, crawler breadth and pacing per family.",
    )
    analyze.add_argument("log", type=Path, help="an access log (plain or gzipped)")
    analyze.add_argument("--top", type=_positive_int, default=10, help="user agents in the top list")
    _add_output_flags(analyze)
    _add_settings_flags(analyze)
    analyze.set_defaults(handler=_run_analyze)

    replay = commands.add_parser(
        "replay",
        help="replay an access log's requests against a server and time them",
        description="Send a log's GET/HEAD requests with their user agents to TARGET: as fast as possible "
        "(--concurrency) or at the log's pace (--speed, open loop). Reports TTFB per class and outcome.",
    )
    replay.add_argument("log", type=Path, help="an access log (plain or gzipped)")
    replay.add_argument("--target", required=True, help="base URL to send the requests to")
    replay.add_argument("--compare", metavar="URL2", help="replay the same requests against URL2 too, and compare")
    replay.add_argument("--concurrency", type=_positive_int, help="clients in closed-loop mode (default 16)")
    replay.add_argument(
        "--speed", type=_positive_float, help="open loop at the log's pace times SPEED (default: closed loop)"
    )
    replay.add_argument("--limit", type=_positive_int, help="replay at most this many requests (default: all)")
    replay.add_argument("--path", help="only targets matching this regular expression (default: all)")
    replay.add_argument("--class", dest="kind", choices=("crawler", "human"), help="only this class (default: both)")
    replay.add_argument("--timeout", type=_positive_float, default=30.0, help="seconds per request")
    _add_output_flags(replay)
    _add_settings_flags(replay)
    replay.set_defaults(handler=_run_replay)

    stats = commands.add_parser(
        "stats",
        help="the live figures of a running gate, in the terminal",
        description="Fetch a running gate's /_crawlergate/stats and show requests, hit ratios and TTFB per class.",
    )
    stats.add_argument("--url", required=True, help="the gate's base URL, e.g. http://127.0.0.1:8080")
    stats.add_argument("--token", default=os.environ.get("CRAWLERGATE_ADMIN_TOKEN", ""), help=_TOKEN_HELP)
    stats.add_argument(
        "--watch",
        type=_positive_float,
        metavar="SECONDS",
        help="refresh every SECONDS until Ctrl-C (default: show once)",
    )
    stats.add_argument("--json", action="store_true", help="print the raw JSON")
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
    warm.add_argument("--concurrency", type=_positive_int, default=8, help="fetches at once (default 8)")
    warm.add_argument("--rate", type=float, default=0.0, help="fetches a second at most (default: no limit)")
    warm.add_argument("--json", type=Path, metavar="FILE", help="also write the summary as JSON")
    _add_site_flags(warm)
    _add_settings_flags(warm, cache=True)
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
        "--concurrency", type=_positive_int, help="fetches at once (regenerate.concurrency, default 2)"
    )
    regenerate.add_argument(
        "--rate", type=_non_negative_float, help="fetches a second, 0: no limit (regenerate.rate, default 10)"
    )
    regenerate.add_argument(
        "--origin-share",
        type=_fraction,
        help="the share of time the origin may spend on the pass, 0: no limit (regenerate.origin_share, default 0.05)",
    )
    regenerate.add_argument(
        "--max-pages", type=_non_negative_int, help="pages at most, 0: no limit (regenerate.max_pages, default 0)"
    )
    regenerate.add_argument(
        "--max-seconds",
        type=_positive_float,
        help="start no fetch after this long (regenerate.max_seconds, default 3600)",
    )
    regenerate.add_argument("--json", type=Path, metavar="FILE", help="also write the summary as JSON")
    _add_site_flags(regenerate)
    _add_settings_flags(regenerate, cache=True)
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
    invalidate.add_argument("--token", default=os.environ.get("CRAWLERGATE_ADMIN_TOKEN", ""), help=_TOKEN_HELP)
    invalidate.add_argument("--prefix", default="/_crawlergate", help="the admin prefix (admin.prefix)")
    invalidate.set_defaults(handler=_run_invalidate)

    simulate = commands.add_parser(
        "simulate",
        help="simulate L1 cache policies over an access log, to size memcached",
        description="Replay a log's cacheable page requests through L1 policies by byte size; only crawler "
        "requests count as hits or misses.",
    )
    simulate.add_argument("log", type=Path, help="an access log (plain or gzipped)")
    simulate.add_argument(
        "--sizes",
        type=_sizes,
        help="L1 sizes, e.g. 120MB,250MB,500MB (default: the paper's 120/250/500 MB, or 10/25/50 %% of the "
        "log's pages when they weigh less)",
    )
    simulate.add_argument("--policies", type=_policies, help="comma-separated; default: all")
    simulate.add_argument("--curve", type=_positive_int, default=10, help="sizes in the hit-ratio curve")
    _add_output_flags(simulate)
    simulate.add_argument("--no-cache", action="store_true", help="parse the log again instead of reusing its trace")
    _add_settings_flags(simulate)
    simulate.set_defaults(handler=_run_simulate)

    ranges = commands.add_parser(
        "ranges",
        help="refresh the published addresses of search-engine crawlers (verify.ranges_file)",
        description="Fetch the lists search engines publish of their crawlers' addresses and write a ranges file "
        "for verify.ranges_file: every family of the current file from its source, or one family from --source. "
        "A claimed crawler from outside its family's addresses is a suspect.",
    )
    ranges.add_argument(
        "--family", help="only this family (a family name of rules/crawlers.toml, e.g. Googlebot; default: all)"
    )
    ranges.add_argument("--source", help="the family's list: a URL or a file (default: the source the file names)")
    ranges.add_argument(
        "--out", type=Path, help="the ranges file to write (default: verify.ranges_file; the shipped one is read-only)"
    )
    _add_settings_flags(ranges)
    ranges.set_defaults(handler=_run_ranges)

    policy = commands.add_parser(
        "policy",
        help="write policy entries from a site's robots.txt: deny the crawler families it shuts out",
        description="Read a robots.txt and print (or write) a [family] table for rules/policy.toml that denies the "
        "crawler families it disallows the whole site. Partial disallows and '*' groups are left to the cache.",
    )
    policy.add_argument("--robots", required=True, help="the robots.txt: a URL or a file")
    policy.add_argument("--out", type=Path, help="write the table to this file (default: standard output)")
    _add_settings_flags(policy)
    policy.set_defaults(handler=_run_policy)

    demo = commands.add_parser(
        "demo",
        help="run the paper's experiment here: the demo forum, crawlergate in front, a trace replayed through both",
        description="Without a sub-command: start the demo forum and crawlergate on loopback, warm L2, replay a "
        "synthetic trace straight to the forum and through crawlergate, print the comparison and an HTML report.",
    )
    demo.add_argument("--threads", type=_positive_int, default=1000, help="threads in the forum")
    demo.add_argument("--requests", type=_positive_int, default=1600, help="page views in the replayed trace")
    demo.add_argument("--work-ms", type=float, default=20.0, help="CPU work per dynamic page, in milliseconds")
    demo.add_argument("--concurrency", type=_positive_int, default=8, help="replay clients")
    demo.add_argument("--dir", type=Path, help="keep the run's files here (default: a new temporary folder)")
    demo.add_argument("--serve", action="store_true", help="leave the forum and the gate running afterwards")
    _add_settings_flags(demo)
    demo.set_defaults(handler=_run_demo)
    demo_commands = demo.add_subparsers(dest="demo_command", metavar="DEMO_COMMAND")
    forum = demo_commands.add_parser("forum", help="serve the demo forum (Starlette + SQLite) on its own")
    forum.add_argument("--host", default="127.0.0.1", help="address to listen on")
    forum.add_argument("--port", type=int, default=8000, help="port to listen on")
    _add_forum_flags(forum)
    forum.set_defaults(handler=_run_demo_forum)
    trace = demo_commands.add_parser("trace", help="write a synthetic access log of the demo forum")
    trace.add_argument("--out", type=Path, required=True, help="the log file to write")
    trace.add_argument("--requests", type=_positive_int, default=20_000, help="page views in the trace")
    trace.add_argument("--duration", type=float, default=86_400.0, help="seconds the trace spans (default a day)")
    trace.add_argument("--crawler-share", type=_fraction, default=0.68, help="crawler share of page views")
    _add_forum_flags(trace)
    trace.set_defaults(handler=_run_demo_trace)
    for command in [*commands.choices.values(), *demo_commands.choices.values()]:
        command.formatter_class = DefaultsShown
    return parser


# Says where the token comes from without showing it (help text is pasted into tickets and chats).
_TOKEN_HELP = "admin bearer token (default: the environment variable CRAWLERGATE_ADMIN_TOKEN)"


class DefaultsShown(argparse.HelpFormatter):
    """Help that shows each option's default, unless its text already says it (settings flags name the setting
    and its default, since their value comes from the settings when the flag is not given)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if not action.option_strings or "default" in text or default in (None, False, "", [], (), argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def _add_output_flags(parser: argparse.ArgumentParser, *, report: bool = True) -> None:
    parser.add_argument("--format", default="auto", help="log format (see classify --help)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE ('-' for stdout)")
    if report:
        parser.add_argument("--report", type=Path, metavar="FILE.html", help="write plots as an HTML page")


def _add_settings_flags(parser: argparse.ArgumentParser, *, cache: bool = False) -> None:
    parser.add_argument(
        "--config", type=Path, help="a crawlergate TOML file (default: none, or the file CRAWLERGATE_CONFIG names)"
    )
    if cache:
        parser.add_argument(
            "--memcached",
            action="append",
            metavar="HOST:PORT",
            help="an L1 memcached server (repeatable; l1.memcached, default none: the embedded LRU)",
        )
        parser.add_argument(
            "--cache-dir", help="the L2 directory (l2.cache_dir, default ~/.cache/crawlergate or $XDG_CACHE_HOME)"
        )


def _add_site_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--origin", help="the site's URL, e.g. http://127.0.0.1:8000 (server.origin, default none: required)"
    )
    parser.add_argument(
        "--public-url",
        help="the site as the world sees it, e.g. https://forum.example.org (server.public_url, default: the "
        "origin's address): fills carry its Host and scheme",
    )
    parser.add_argument(
        "--site",
        action="append",
        metavar="PROFILE",
        help="a site profile from rules/sites/ (trac, django, mediawiki, wordpress, dokuwiki, phpbb, discourse, "
        "demo-forum; repeatable; cache.sites, default none)",
    )


def _add_forum_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=_positive_int, default=3000, help="threads to seed (the paper's: 153100)")
    parser.add_argument("--work-ms", type=float, default=20.0, help="CPU work per dynamic page, in milliseconds")
    parser.add_argument("--seed", type=int, default=2012, help="seed of the forum's content and of the trace")
    parser.add_argument("--db", type=Path, help="the SQLite file (default: in the user's cache folder)")


def _settings(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> Settings:
    return load_settings(args.config, os.environ, overrides)


def _flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Settings given as command-line flags, as dotted keys (they win over file and environment)."""
    flags = {
        "server.origin": getattr(args, "origin", None),
        "server.public_url": getattr(args, "public_url", None),
        "cache.sites": tuple(args.site) if getattr(args, "site", None) else None,
        "cache.storage_mode": "rfc9111" if getattr(args, "strict", False) else None,
        "server.host": getattr(args, "host", None),
        "server.port": getattr(args, "port", None),
        "server.workers": getattr(args, "workers", None),
        "l1.memcached": tuple(args.memcached) if getattr(args, "memcached", None) else None,
        "l2.cache_dir": getattr(args, "cache_dir", None),
    }
    return {key: value for key, value in flags.items() if value is not None}


def _run_serve(args: argparse.Namespace) -> int:
    from crawlergate.adapters.server import run_proxy

    return run_proxy(_settings(args, _flag_overrides(args)))


def _run_check(args: argparse.Namespace) -> int:
    import asyncio

    from crawlergate.check import check_page

    report = asyncio.run(check_page(_settings(args, _flag_overrides(args)), args.url))
    if args.json:
        _write_json("-", report.as_json())
    else:
        print(report.text())
    return EXIT_OK if report.stored else EXIT_FAILURE


def _run_ranges(args: argparse.Namespace) -> int:
    import datetime
    import difflib

    from crawlergate.suspect.ranges import (
        default_ranges_file,
        fetch_published,
        load_ranges,
        ranges_text,
        read_published,
        with_prefixes,
    )

    settings = _settings(args)
    families = {family.name for family in Classifier.from_settings(settings.classify).ruleset.families}
    if args.family and args.family not in families:
        close = difflib.get_close_matches(args.family, families, n=1)
        raise CrawlerGateError(
            f"No crawler family {args.family!r} in the rules" + (f"; did you mean {close[0]!r}?" if close else ".")
        )
    current_file = Path(settings.verify.ranges_file) if settings.verify.ranges_file else default_ranges_file()
    out = args.out or (Path(settings.verify.ranges_file) if settings.verify.ranges_file else None)
    if out is None:
        raise CrawlerGateError("Give --out FILE (or set verify.ranges_file): the shipped snapshot is not rewritten.")
    ranges = load_ranges(out if out.exists() else current_file)
    if args.family:
        engine = ranges.engines.get(args.family)
        source = args.source or (engine.source if engine is not None else "")
        if not source:
            raise CrawlerGateError(f"{args.family}: no source known; give --source URL_OR_FILE.")
        wanted = [(args.family, source)]
    elif args.source:
        raise CrawlerGateError("--source needs --family: which family's list it is.")
    else:
        wanted = [(engine.family, engine.source) for engine in ranges.engines.values() if engine.source]
    failed = 0
    for family, source in wanted:
        before = len(ranges.engines[family].prefixes) if family in ranges.engines else 0
        try:
            prefixes = read_published(fetch_published(source), source)
        except CrawlerGateError as exc:
            print(f"{family}: kept its {before:,} prefixes: {exc}", file=sys.stderr)
            failed += 1
            continue
        ranges = with_prefixes(ranges, family, prefixes, source)
        print(f"{family}: {len(prefixes):,} prefixes (were {before:,}) from {source}")
    _write_text(out, ranges_text(ranges, datetime.date.today().isoformat()))
    print(f"wrote {out}" + ("" if settings.verify.ranges_file else "; set verify.ranges_file to it"))
    return EXIT_FAILURE if failed else EXIT_OK


def _run_policy(args: argparse.Namespace) -> int:
    from crawlergate.suspect.ranges import fetch_published
    from crawlergate.suspect.robots import policy_from_robots

    classifier = Classifier.from_settings(_settings(args).classify)
    table = policy_from_robots(fetch_published(args.robots), classifier)
    if args.out:
        _write_text(args.out, table)
        print(f"wrote {args.out}")
    else:
        print(table, end="")
    return EXIT_OK


def _run_analyze(args: argparse.Namespace) -> int:
    from crawlergate.tools.analyze import format_profile, profile_html, profile_log

    classifier = Classifier.from_settings(_settings(args).classify)
    out = _text_out(args)
    log_format = _open_log(args).format
    with Progress(f"reading {args.log.name}", total=1, unit="B") as progress:
        reader = LogReader(args.log, log_format, on_progress=_progress_bytes(progress))
        profile = profile_log(reader, classifier)
    _after_reading(reader)
    print(format_profile(profile, classifier, args.top), file=out)
    print(f"\n{reader.lines:,} lines read, {reader.malformed:,} malformed skipped", file=out)
    if args.json:
        data = profile.as_json(classifier, args.top)
        data.update(lines=reader.lines, malformed=reader.malformed)
        _write_json(args.json, data)
    if args.report:
        _write_text(args.report, profile_html(profile, classifier, args.top))
        print(f"report: {args.report}", file=out)
    return EXIT_OK


def _run_replay(args: argparse.Namespace) -> int:
    import re

    from crawlergate.tools.replay import comparison, format_summary, replay, requests_from_log, run_replay
    from crawlergate.tools.replayreport import report_html

    for url in filter(None, (args.target, args.compare)):
        if not re.match(r"^https?://[^/\s]+", url) or not _has_valid_port(url):
            raise CrawlerGateError(f"Target '{url}' must be an http:// or https:// URL, with a port from 1 to 65535.")
    if args.speed is not None and args.concurrency is not None:
        raise CrawlerGateError(
            "--concurrency (closed loop: clients as fast as the server answers) and --speed (open loop: the "
            "log's own pace) are two ways of replaying; give one."
        )
    concurrency = args.concurrency or 16
    try:
        pattern = re.compile(args.path).search if args.path else None
    except re.error as exc:
        raise CrawlerGateError(f"--path {args.path!r} is not a regular expression: {exc}.") from None
    classifier = Classifier.from_settings(_settings(args).classify)
    reader = _open_log(args)
    requests = requests_from_log(reader, classifier, limit=args.limit, path_pattern=pattern, kind=args.kind)
    if args.limit is None or len(requests) < args.limit:
        _after_reading(reader)
    if not requests:
        raise CrawlerGateError(f"No GET/HEAD requests to replay in '{args.log}' (after filters).")
    mode = f"open loop at {args.speed:g}x the log's pace" if args.speed else f"{concurrency} clients"
    print(
        f"replaying {len(requests):,} requests ({reader.malformed:,} malformed lines skipped), {mode}", file=sys.stderr
    )
    results = []
    for url in filter(None, (args.target, args.compare)):
        with Progress(f"replay against {url}", total=len(requests), unit=" requests") as progress:
            result = run_replay(
                replay(
                    requests, url, concurrency=concurrency, speed=args.speed, timeout_s=args.timeout,
                    on_progress=lambda done, _: progress.update(done),
                )
            )  # fmt: skip
        results.append(result)
    out = _text_out(args)
    failed = [result for result in results if not result.samples and result.errors]
    if failed:
        for result in failed:
            kinds = ", ".join(f"{count:,} {kind}" for kind, count in result.errors.most_common())
            print(f"crawlergate: every request to {result.target} failed ({kinds}): is it up?", file=sys.stderr)
        return EXIT_FAILURE
    print(format_summary(results), file=out)
    if args.json:
        _write_json(args.json, comparison(results) if len(results) == 2 else results[0].summary())
    if args.report:
        _write_text(args.report, report_html(results))
        print(f"report: {args.report}", file=out)
    return EXIT_OK


def _run_stats(args: argparse.Namespace) -> int:

    import httpx

    url = args.url.rstrip("/") + args.prefix + "/stats"
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    while True:
        try:
            response = httpx.get(url, headers=headers, timeout=5)
        except httpx.HTTPError as exc:
            raise CrawlerGateError(f"Cannot reach {url}: {exc}.") from None
        if response.status_code != 200:
            raise CrawlerGateError(f"{url} answered {response.status_code}: {response.text.strip()[:200]}")
        data = response.json()
        print(json.dumps(data, indent=2, sort_keys=True) if args.json else _format_stats(data), flush=True)
        if not args.watch:
            return EXIT_OK
        time.sleep(args.watch)
        print()


def _run_warm(args: argparse.Namespace) -> int:
    import asyncio

    from crawlergate.adapters.proxy import create_app
    from crawlergate.warm import file_urls, log_urls, sitemap_urls, warm

    settings = _settings(args, _flag_overrides(args))
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
            await gate.app.aclose()  # type: ignore[attr-defined]
            gate.filler.close()
            gate.core.close()
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

    overrides = _flag_overrides(args)
    for flag in ("concurrency", "rate", "origin_share", "max_pages", "max_seconds"):
        if getattr(args, flag) is not None:
            overrides[f"regenerate.{flag}"] = getattr(args, flag)
    settings = _settings(args, overrides)
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
            await gate.app.aclose()  # type: ignore[attr-defined]
            gate.filler.close()
            gate.core.close()
            job.state.close()
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
        _write_text(args.json, json.dumps(summary.as_dict(), indent=2, sort_keys=True))
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


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def _run_invalidate(args: argparse.Namespace) -> int:
    import httpx

    if not args.urls and not args.pattern:
        raise CrawlerGateError("Give the pages to mark: URL arguments, --pattern P, or both.")
    if not args.token:
        raise CrawlerGateError("invalidate needs the gate's admin token: set CRAWLERGATE_ADMIN_TOKEN or give --token.")
    url = args.gate.rstrip("/") + args.prefix + "/invalidate"
    try:
        response = httpx.post(
            url,
            json={"urls": args.urls, "patterns": args.pattern},
            headers={"authorization": f"Bearer {args.token}"},
            timeout=30,
        )
    except httpx.HTTPError as exc:
        raise CrawlerGateError(f"Cannot reach {url}: {exc}.") from None
    if response.status_code != 200:
        raise CrawlerGateError(f"{url} answered {response.status_code}: {response.text.strip()[:200]}")
    print(f"marked {response.json()['marked']:,} page(s) changed")
    return EXIT_OK


def _format_stats(data: dict[str, Any]) -> str:
    lines = [f"{'':<8}{'requests':>10}{'L1 hits':>10}{'L2 hits':>10}{'misses':>9}{'stale':>7}{'passes':>9}"
             f"{'hit ratio':>11}{'TTFB p50':>10}{'p99':>9}{'mean ms':>9}"]  # fmt: skip
    for kind in ("crawler", "suspect", "human"):
        row = data.get(kind, {})
        ttfb = row.get("ttfb_ms", {})
        lines.append(
            f"{kind:<8}{row.get('requests', 0):>10,}{row.get('l1_hits', 0):>10,}{row.get('l2_hits', 0):>10,}"
            f"{row.get('misses', 0):>9,}{row.get('stale', 0):>7,}{row.get('passes', 0):>9,}"
            f"{row.get('hit_ratio', 0):>11.1%}{ttfb.get('p50', 0):>10.2f}{ttfb.get('p99', 0):>9.2f}"
            f"{ttfb.get('mean', 0):>9.2f}"
        )
    origin, share = data.get("origin", {}), data.get("crawler_share", {})
    origin_s = origin.get("seconds", {})
    prefetches, evictions = data.get("prefetches", {}), data.get("evictions", {})
    l1, l2 = data.get("l1", {}), data.get("l2", {})
    l1_fill = f", {l1['used_bytes'] / 1e6:.1f} of {l1['max_bytes'] / 1e6:.0f} MB" if "max_bytes" in l1 else ""
    lines += [
        f"crawler share: {share.get('requests', 0):.1%} of requests, {share.get('origin_time', 0):.1%} of origin time; "
        f"origin time saved by hits {data.get('origin_time_saved_s', 0):,.1f} s",
        f"origin: {origin.get('requests', 0):,} guest fills ({origin.get('errors', 0):,} errors), "
        f"p50 {origin.get('ttfb_ms', {}).get('p50', 0):,.2f} ms; origin time for crawlers "
        f"{origin_s.get('crawler', 0):,.1f} s, for humans {origin_s.get('human', 0):,.1f} s",
        f"L1 {l1.get('backend', '?')}{l1_fill}; L2 {l2.get('pages', 0):,} pages, {l2.get('bytes', 0) / 1e6:.1f} MB; "
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
    if regeneration:
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


def _run_simulate(args: argparse.Namespace) -> int:

    from crawlergate.config import default_cache_root
    from crawlergate.keys import KeyMaker
    from crawlergate.rules import resolve_rule_files, rules_fingerprint
    from crawlergate.tools.simulate import POLICIES, default_sizes, format_report, load_trace, run_simulation
    from crawlergate.tools.simulatereport import report_html

    settings = _settings(args)
    classifier = Classifier.from_settings(settings.classify)
    classify_settings = settings.classify
    cache_rules = resolve_rule_files(classify_settings.rules_dir, (settings.cache.rules_file,), ())[0]
    keys = KeyMaker.from_settings(settings)
    rule_files = resolve_rule_files(
        classify_settings.rules_dir, classify_settings.rule_files, classify_settings.extra_rules
    )
    cache_dir = None if args.no_cache else default_cache_root() / "crawlergate-sim"
    started = time.perf_counter()
    out = _text_out(args)
    log_format = _open_log(args).format.spec
    with Progress(f"reading {args.log.name}", total=1, unit="B") as progress:
        trace = load_trace(
            args.log, classifier, keys, log_format=log_format, cache_dir=cache_dir,
            rules_fingerprint=rules_fingerprint([*rule_files, cache_rules]), on_progress=_progress_bytes(progress),
        )  # fmt: skip
    parsed = time.perf_counter() - started
    trace.assume_sizes_when_unknown()
    if trace.lines and trace.malformed >= trace.lines:
        raise CrawlerGateError(
            f"Log file '{args.log}': none of its {trace.lines:,} lines read as {trace.format_description}."
        )
    if trace.truncated:
        print(f"warning: the log ends early: {trace.truncated}", file=sys.stderr)
    if trace.lines and trace.malformed > 0.05 * trace.lines:
        example = f"; e.g. {trace.malformed_example}" if trace.malformed_example else ""
        print(f"warning: {trace.malformed:,} of {trace.lines:,} lines did not read as {trace.format_description}"
              f"{example}", file=sys.stderr)  # fmt: skip
    policies = args.policies or list(POLICIES)
    report = run_simulation(
        trace,
        args.sizes or default_sizes(trace, settings.l1.item_max_bytes),
        policies,
        args.curve,
        item_max_bytes=settings.l1.item_max_bytes,
    )
    print(format_report(report, policies), file=out)
    print(f"\n{trace.lines:,} lines ({trace.malformed:,} malformed, skipped) read in {parsed:.2f} s; "
          f"all simulations in {time.perf_counter() - started - parsed:.2f} s", file=out)  # fmt: skip
    if args.json:
        _write_json(args.json, report.as_json())
    if args.report:
        _write_text(args.report, report_html(report, policies))
        print(f"report: {args.report}", file=out)
    return EXIT_OK


def _run_demo(args: argparse.Namespace) -> int:
    from crawlergate.demo.run import DemoSpec, run_demo

    spec = DemoSpec(threads=args.threads, requests=args.requests, work_ms=args.work_ms, concurrency=args.concurrency)
    return run_demo(spec, _settings(args), args.dir, serve=args.serve)


def _run_demo_forum(args: argparse.Namespace) -> int:
    import uvicorn

    from crawlergate.demo.forum import create_forum

    db = args.db or _default_forum_db(args.threads, args.seed)
    print(f"seeding {db} with {args.threads:,} threads (reused when it exists)", file=sys.stderr)
    app = create_forum(db, threads=args.threads, seed=args.seed, work_ms=args.work_ms)
    print(f"demo forum on http://{args.host}:{args.port} ({args.work_ms:g} ms of work a page)", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return EXIT_OK


def _run_demo_trace(args: argparse.Namespace) -> int:
    from crawlergate.demo.seed import seed_database
    from crawlergate.demo.trace import TraceSpec, structure_of, write_trace

    db = args.db or _default_forum_db(args.threads, args.seed)
    seed_database(db, threads=args.threads, seed=args.seed)
    spec = TraceSpec(
        requests=args.requests,
        duration_s=args.duration,
        crawler_share=args.crawler_share,
        page_cost_us=int(args.work_ms * 1000),
        seed=args.seed,
    )
    with Progress(f"writing {args.out.name}", total=args.requests, unit=" lines") as progress:
        lines = write_trace(args.out, spec, structure_of(db), on_progress=progress.update)
    print(f"wrote {lines:,} lines to {args.out} (forum of {args.threads:,} threads in {db})")
    return EXIT_OK


def _default_forum_db(threads: int, seed: int) -> Path:
    from crawlergate.config import default_cache_root

    return default_cache_root() / "crawlergate-demo" / f"forum-{threads}-{seed}.sqlite3"


def _run_classify(args: argparse.Namespace) -> int:
    classifier = Classifier.from_settings(_settings(args).classify)
    if args.log is not None:
        return _classify_log(args, classifier)
    if args.file is not None:
        lines = _read_lines(args.file)
    elif args.user_agents:
        lines = iter(args.user_agents)
    else:
        print("crawlergate classify: give user agents, --file F or --log F", file=sys.stderr)
        return EXIT_USAGE
    verdicts = _classify_lines(lines, classifier, families=args.families, out=_text_out(args))
    if args.json:
        _write_json(args.json, verdicts)
    return EXIT_OK


def _classify_lines(lines: Iterable[str], classifier: Classifier, *, families: bool, out: TextIO) -> dict[str, int]:
    classify = classifier.classify
    counts = {"crawler": 0, "human": 0}
    batch: list[str] = []
    for line in lines:
        verdict = classify(line)
        counts[verdict.kind] += 1
        if families:
            batch.append(f"{verdict.kind}\t{verdict.family}\t{verdict.tag}\t{line}\n")
        else:
            batch.append(f"{verdict.kind}\t{line}\n")
        if len(batch) >= 4096:
            out.write("".join(batch))
            batch.clear()
    out.write("".join(batch))
    out.flush()
    return counts


def _read_lines(path: Path) -> Iterable[str]:
    if str(path) == "-":
        return (line.rstrip("\r\n") for line in sys.stdin)
    try:
        handle = path.open(encoding="utf-8", errors="replace", newline="")
    except OSError as exc:
        raise CrawlerGateError(f"File '{path}' cannot be read: {exc.strerror}.") from None

    def lines() -> Iterable[str]:
        with handle:
            for line in handle:
                yield line.rstrip("\r\n")

    return lines()


def _classify_log(args: argparse.Namespace, classifier: Classifier) -> int:
    out = _text_out(args)
    reader = _open_log(args)
    with Progress(f"reading {args.log.name}", total=1, unit="B") as progress:
        reader = LogReader(args.log, reader.format, on_progress=_progress_bytes(progress))
        report = crawler_share(reader, classifier)
    _after_reading(reader)
    print(format_share(report, classifier, args.top), file=out)
    skipped = f"{reader.malformed:,} malformed line(s) skipped" if reader.malformed else "no malformed lines"
    print(f"\n{reader.lines:,} lines read, {skipped}", file=out)
    if args.json:
        data = share_as_json(report, classifier, args.top)
        data.update(lines=reader.lines, malformed=reader.malformed)
        _write_json(args.json, data)
    return EXIT_OK


def _has_valid_port(url: str) -> bool:
    from urllib.parse import urlsplit

    try:
        port = urlsplit(url).port
    except ValueError:
        return False
    return port is None or port > 0


def _open_log(args: argparse.Namespace) -> LogReader:
    """A reader of ``args.log`` whose format is known (detected or given), after one line saying which it is.

    The output files are checked first: a long run must not end on an unwritable --json or --report path.
    """
    for output in (getattr(args, "json", None), getattr(args, "report", None)):
        if output not in (None, "-") and not os.access(Path(output).resolve().parent, os.W_OK):
            raise CrawlerGateError(f"Cannot write '{output}': its folder does not exist or is not writable.")
    reader = LogReader(args.log, args.format)
    print(f"{args.log.name}: read as {reader.format.description}", file=sys.stderr)
    if not reader.format.has_user_agent:
        raise CrawlerGateError(
            f"Log file '{args.log}' records no user agents ({reader.format.description}), so crawlers cannot be "
            "told from people in it. Log them: nginx/Apache 'combined', IIS cs(User-Agent), Traefik "
            "accessLog.fields.headers.names.User-Agent=keep."
        )
    return reader


def _after_reading(reader: LogReader) -> None:
    """Refuse a log of which no line was a request; warn about a damaged or partly unreadable one."""
    reader.require_requests()
    for warning in reader.warnings():
        print(f"warning: {warning}", file=sys.stderr)


def _text_out(args: argparse.Namespace) -> TextIO:
    """Where the human-readable report goes: standard output, unless the JSON goes there."""
    return sys.stderr if getattr(args, "json", None) == "-" else sys.stdout


def _progress_bytes(progress: Progress) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        progress.total = total
        progress.update(done)

    return report


def _write_json(target: str, data: Any) -> None:
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if target == "-":
        sys.stdout.write(text)
    else:
        _write_text(Path(target), text)


def _write_text(target: Path, text: str) -> None:
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CrawlerGateError(f"Cannot write '{target}': {exc.strerror}.") from None


def _sizes(text: str) -> list[int]:
    from crawlergate.config import parse_size

    try:
        sizes = [parse_size(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes look like 120MB,250MB,500MB, not {text!r}") from None
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"sizes must be positive, not {text!r}")
    return sizes


def _policies(text: str) -> list[str]:
    from crawlergate.tools.simulate import POLICIES

    policies = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [policy for policy in policies if policy not in POLICIES]
    if unknown or not policies:
        named = ", ".join(unknown) or repr(text)
        raise argparse.ArgumentTypeError(f"unknown policy {named}; known: {', '.join(POLICIES)}")
    return policies


def _number_argument(convert: Callable[[str], Any], accept: Callable[[Any], bool], rule: str) -> Callable[[str], Any]:
    """An argparse type: ``convert`` the text, or say what it must be."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, not {text!r}")
        return value

    return parse


_positive_int = _number_argument(int, lambda value: value > 0, "a positive integer")
_positive_float = _number_argument(float, lambda value: value > 0, "a positive number")
_fraction = _number_argument(float, lambda value: 0 <= value <= 1, "a number from 0 to 1")
_non_negative_int = _number_argument(int, lambda value: value >= 0, "0 or a positive integer")
_non_negative_float = _number_argument(float, lambda value: value >= 0, "0 or a positive number")
