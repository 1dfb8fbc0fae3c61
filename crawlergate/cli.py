"""The ``crawlergate`` command.

    crawlergate classify "Mozilla/5.0 (compatible; Googlebot/2.1)"
    crawlergate classify --file user-agents.txt
    crawlergate classify --log access.log.gz --json report.json

Every command that takes settings reads ``--config FILE`` and ``CRAWLERGATE_*`` variables.
Errors a user can fix (a bad setting, a missing file) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from crawlergate import __version__
from crawlergate.analyze import crawler_share, format_share, share_as_json
from crawlergate.classify import Classifier
from crawlergate.config import Settings, load_settings
from crawlergate.errors import CrawlerGateError
from crawlergate.logparse import PRESETS, LogFormat, LogReader
from crawlergate.progress import Progress

EXIT_OK = 0
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
        help=f"log format: auto, {', '.join(PRESETS)}, or an Apache LogFormat / nginx log_format string",
    )
    classify.add_argument("--families", action="store_true", help="add the crawler family and tag as columns")
    classify.add_argument("--top", type=_positive_int, default=10, help="user agents in the --log top list")
    classify.add_argument("--json", metavar="FILE", help="write the result as JSON to FILE ('-' for stdout)")
    _add_settings_flags(classify)
    classify.set_defaults(handler=_run_classify)
    return parser


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="a crawlergate TOML file")


def _settings(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> Settings:
    return load_settings(args.config, os.environ, overrides)


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
    verdicts = _classify_lines(lines, classifier, families=args.families, out=sys.stdout)
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
    log_format = LogFormat(args.format)
    with Progress(f"reading {args.log.name}", total=1, unit="B") as progress:
        reader = LogReader(args.log, log_format, on_progress=_progress_bytes(progress))
        report = crawler_share(reader, classifier)
    print(format_share(report, classifier, args.top))
    skipped = f"{reader.malformed:,} malformed line(s) skipped" if reader.malformed else "no malformed lines"
    print(f"\n{reader.lines:,} lines read, {skipped}")
    if reader.truncated:
        print(f"warning: the log ends early: {reader.truncated}", file=sys.stderr)
    if args.json:
        data = share_as_json(report, classifier, args.top)
        data.update(lines=reader.lines, malformed=reader.malformed)
        _write_json(args.json, data)
    return EXIT_OK


def _progress_bytes(progress: Progress) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        progress.total = total
        progress.update(done)

    return report


def _write_json(target: str, data: Any) -> None:
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if target == "-":
        sys.stdout.write(text)
        return
    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CrawlerGateError(f"Cannot write '{target}': {exc.strerror}.") from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return value
