"""The offline tools' commands: classify, analyze, replay, simulate."""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from crawlergate.classify import Classifier
from crawlergate.commands.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    add_output_flags,
    add_settings_flags,
    after_reading,
    open_agents_log,
    positive_float,
    positive_int,
    progress_bytes,
    settings_of,
    text_out,
    write_json,
    write_text,
)
from crawlergate.errors import CrawlerGateError
from crawlergate.progress import Progress
from crawlergate.tools.analyze import crawler_share, format_share, share_as_json
from crawlergate.tools.logparse import PRESETS, LogReader


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The sub-commands of this family, added to the top parser's."""
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
    classify.add_argument("--top", type=positive_int, default=10, help="user agents in the --log top list")
    classify.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE ('-' for stdout)")
    add_settings_flags(classify)
    classify.set_defaults(handler=_run_classify)

    analyze = commands.add_parser(
        "analyze",
        help="characterise an access log: crawler share, daily pattern, off-peak hour, crawler breadth",
        description="The paper's section 2 on any log: crawler share of requests and server time, top user agents, "
        "requests per hour for humans and crawlers, the off-peak hour, crawler breadth and pacing per family.",
    )
    analyze.add_argument("log", type=Path, help="an access log (plain or gzipped)")
    analyze.add_argument("--top", type=positive_int, default=10, help="user agents in the top list")
    add_output_flags(analyze)
    add_settings_flags(analyze)
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
    replay.add_argument("--concurrency", type=positive_int, help="clients in closed-loop mode (default 16)")
    replay.add_argument(
        "--speed", type=positive_float, help="open loop at the log's pace times SPEED (default: closed loop)"
    )
    replay.add_argument("--limit", type=positive_int, help="replay at most this many requests (default: all)")
    replay.add_argument("--path", help="only targets matching this regular expression (default: all)")
    replay.add_argument("--class", dest="kind", choices=("crawler", "human"), help="only this class (default: both)")
    replay.add_argument("--timeout", type=positive_float, default=30.0, help="seconds per request")
    add_output_flags(replay)
    add_settings_flags(replay)
    replay.set_defaults(handler=_run_replay)

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
    simulate.add_argument("--curve", type=positive_int, default=10, help="sizes in the hit-ratio curve")
    add_output_flags(simulate)
    simulate.add_argument("--no-cache", action="store_true", help="parse the log again instead of reusing its trace")
    add_settings_flags(simulate)
    simulate.set_defaults(handler=_run_simulate)


def _run_classify(args: argparse.Namespace) -> int:
    classifier = Classifier.from_settings(settings_of(args).classify)
    if args.log is not None:
        return _classify_log(args, classifier)
    if args.file is not None:
        lines = _read_lines(args.file)
    elif args.user_agents:
        lines = iter(args.user_agents)
    else:
        print("crawlergate classify: give user agents, --file F or --log F", file=sys.stderr)
        return EXIT_USAGE
    verdicts = _classify_lines(lines, classifier, families=args.families, out=text_out(args))
    if args.json:
        write_json(args.json, verdicts)
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
        raw = path.open("rb")
        start = raw.peek(8192)[:8192]  # looked at, not taken: a pipe is read once
    except OSError as exc:
        raise CrawlerGateError(f"File '{path}' cannot be read: {exc.strerror}.") from None
    if b"\0" in start:
        raw.close()
        raise CrawlerGateError(f"File '{path}' is not text (it holds NUL bytes): give one user agent a line.")
    handle = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")

    def lines() -> Iterable[str]:
        with handle:
            for line in handle:
                yield line.rstrip("\r\n")

    return lines()


def _classify_log(args: argparse.Namespace, classifier: Classifier) -> int:
    out = text_out(args)
    reader = _open_log(args)
    with Progress(f"reading {args.log.name}", total=1, unit="B") as progress:
        reader = LogReader(args.log, reader.format, on_progress=progress_bytes(progress))
        report = crawler_share(reader, classifier)
    after_reading(reader)
    print(format_share(report, classifier, args.top), file=out)
    skipped = f"{reader.malformed:,} malformed line(s) skipped" if reader.malformed else "no malformed lines"
    print(f"\n{reader.lines:,} lines read, {skipped}", file=out)
    if args.json:
        data = share_as_json(report, classifier, args.top)
        data.update(lines=reader.lines, malformed=reader.malformed)
        write_json(args.json, data)
    return EXIT_OK


def _run_analyze(args: argparse.Namespace) -> int:
    from crawlergate.tools.analyze import format_profile, profile_html, profile_log

    classifier = Classifier.from_settings(settings_of(args).classify)
    out = text_out(args)
    log_format = _open_log(args).format
    with Progress(f"reading {args.log.name}", total=1, unit="B") as progress:
        reader = LogReader(args.log, log_format, on_progress=progress_bytes(progress))
        profile = profile_log(reader, classifier)
    after_reading(reader)
    print(format_profile(profile, classifier, args.top), file=out)
    print(f"\n{reader.lines:,} lines read, {reader.malformed:,} malformed skipped", file=out)
    if args.json:
        data = profile.as_json(classifier, args.top)
        data.update(lines=reader.lines, malformed=reader.malformed)
        write_json(args.json, data)
    if args.report:
        write_text(args.report, profile_html(profile, classifier, args.top))
        print(f"report: {args.report}", file=out)
    return EXIT_OK


def _run_replay(args: argparse.Namespace) -> int:
    import re

    from crawlergate.tools.replay import comparison, format_summary, replay, requests_from_log, run_replay
    from crawlergate.tools.replayreport import report_html

    for url in (url for url in (args.target, args.compare) if url is not None):
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
    classifier = Classifier.from_settings(settings_of(args).classify)
    reader = _open_log(args)
    requests = requests_from_log(reader, classifier, limit=args.limit, path_pattern=pattern, kind=args.kind)
    if args.limit is None or len(requests) < args.limit:
        after_reading(reader)
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
    out = text_out(args)
    failed = [result for result in results if not result.samples and result.errors]
    if failed:
        for result in failed:
            kinds = ", ".join(f"{count:,} {kind}" for kind, count in result.errors.most_common())
            print(f"crawlergate: every request to {result.target} failed ({kinds}): is it up?", file=sys.stderr)
        return EXIT_FAILURE
    print(format_summary(results), file=out)
    if args.json:
        write_json(args.json, comparison(results) if len(results) == 2 else results[0].summary())
    if args.report:
        write_text(args.report, report_html(results))
        print(f"report: {args.report}", file=out)
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
    return open_agents_log(args.log, args.format)


def _run_simulate(args: argparse.Namespace) -> int:

    from crawlergate.config import default_cache_root
    from crawlergate.keys import KeyMaker
    from crawlergate.rules import resolve_rule_files, rules_fingerprint
    from crawlergate.tools.simulate import POLICIES, default_sizes, format_report, load_trace, run_simulation
    from crawlergate.tools.simulatereport import report_html

    settings = settings_of(args)
    classifier = Classifier.from_settings(settings.classify)
    classify_settings = settings.classify
    cache_rules = resolve_rule_files(classify_settings.rules_dir, (settings.cache.rules_file,), ())[0]
    keys = KeyMaker.from_settings(settings)
    rule_files = resolve_rule_files(
        classify_settings.rules_dir, classify_settings.rule_files, classify_settings.extra_rules
    )
    cache_dir = None if args.no_cache else default_cache_root() / "crawlergate-sim"
    started = time.perf_counter()
    out = text_out(args)
    log_format = _open_log(args).format.spec
    with Progress(f"reading {args.log.name}", total=1, unit="B") as progress:
        trace = load_trace(
            args.log, classifier, keys, log_format=log_format, cache_dir=cache_dir,
            rules_fingerprint=rules_fingerprint([*rule_files, cache_rules]), on_progress=progress_bytes(progress),
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
        write_json(args.json, report.as_json())
    if args.report:
        write_text(args.report, report_html(report, policies))
        print(f"report: {args.report}", file=out)
    return EXIT_OK


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
