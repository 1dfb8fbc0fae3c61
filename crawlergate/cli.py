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
import os
import sys
from collections.abc import Sequence

import httpx

from crawlergate import __version__
from crawlergate.commands import demo, front, gate, suspects, tools
from crawlergate.commands.common import EXIT_OK, EXIT_USAGE, DefaultsShown
from crawlergate.errors import CrawlerGateError


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
    except httpx.InvalidURL as exc:
        print(f"crawlergate: not a URL this can ask: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader (e.g. `head`) went away; that is not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        # A path given that cannot be used (no such folder, a folder where a file goes, no permission): the
        # commands check the paths they read; this is the one line for the rest.
        if exc.strerror is None:
            raise
        print(f"crawlergate: {exc.filename or 'a file'}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("crawlergate: interrupted", file=sys.stderr)
        return 130
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crawlergate",
        description="Keep search-engine and AI crawlers from overloading a dynamic web site.",
    )
    parser.add_argument("--version", action="version", version=f"crawlergate {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for family in (gate, front, tools, suspects, demo):
        family.add_parsers(commands)
    for command in commands.choices.values():
        command.formatter_class = DefaultsShown
    return parser
