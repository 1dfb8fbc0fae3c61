"""The suspects' commands: ranges (published crawler addresses) and policy (from robots.txt)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crawlergate.classify import Classifier
from crawlergate.commands.common import (
    EXIT_FAILURE,
    EXIT_OK,
    add_settings_flags,
    settings_of,
    write_text,
)
from crawlergate.errors import CrawlerGateError


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The sub-commands of this family, added to the top parser's."""
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
    add_settings_flags(ranges)
    ranges.set_defaults(handler=_run_ranges)

    policy = commands.add_parser(
        "policy",
        help="write policy entries from a site's robots.txt: deny the crawler families it shuts out",
        description="Read a robots.txt and print (or write) a [family] table for rules/policy.toml that denies the "
        "crawler families it disallows the whole site. Partial disallows and '*' groups are left to the cache.",
    )
    policy.add_argument("--robots", required=True, help="the robots.txt: a URL or a file")
    policy.add_argument("--out", type=Path, help="write the table to this file (default: standard output)")
    add_settings_flags(policy)
    policy.set_defaults(handler=_run_policy)


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

    settings = settings_of(args)
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
    write_text(out, ranges_text(ranges, datetime.date.today().isoformat()))
    print(f"wrote {out}" + ("" if settings.verify.ranges_file else "; set verify.ranges_file to it"))
    return EXIT_FAILURE if failed else EXIT_OK


def _run_policy(args: argparse.Namespace) -> int:
    from crawlergate.suspect.ranges import fetch_published
    from crawlergate.suspect.robots import policy_from_robots

    classifier = Classifier.from_settings(settings_of(args).classify)
    table = policy_from_robots(fetch_published(args.robots), classifier)
    if args.out:
        write_text(args.out, table)
        print(f"wrote {args.out}")
    else:
        print(table, end="")
    return EXIT_OK
