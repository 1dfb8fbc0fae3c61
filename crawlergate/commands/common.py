"""What every family of sub-commands shares: exit statuses, settings flags, argument types, output."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from crawlergate.config import Settings, load_settings
from crawlergate.errors import CrawlerGateError
from crawlergate.progress import Progress
from crawlergate.tools.logparse import LogReader

EXIT_OK = 0
# `check`: the page would not be stored.
EXIT_FAILURE = 1
EXIT_USAGE = 2


# Says where the token comes from without showing it (help text is pasted into tickets and chats).
TOKEN_HELP = "admin bearer token (default: the environment variable CRAWLERGATE_ADMIN_TOKEN)"


class DefaultsShown(argparse.HelpFormatter):
    """Help that shows each option's default, unless its text already says it (settings flags name the setting
    and its default, since their value comes from the settings when the flag is not given)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if not action.option_strings or "default" in text or default in (None, False, "", [], (), argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def add_output_flags(parser: argparse.ArgumentParser, *, report: bool = True) -> None:
    parser.add_argument("--format", default="auto", help="log format (see classify --help)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE ('-' for stdout)")
    if report:
        parser.add_argument("--report", type=Path, metavar="FILE.html", help="write plots as an HTML page")


def add_settings_flags(parser: argparse.ArgumentParser, *, cache: bool = False) -> None:
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
            "--cache-dir", help="the L2 directory (l2.cache_dir; default: the site's own in ~/.cache/crawlergate/sites)"
        )


def add_site_flags(parser: argparse.ArgumentParser) -> None:
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
        metavar="PROFILE|HOST=ORIGIN",
        help="a site profile from rules/sites/ (trac, django, mediawiki, wordpress, dokuwiki, phpbb, discourse, "
        "demo-forum; repeatable; cache.sites, default none); or, for serve, one of several sites: its host names "
        "(comma-separated) and origin, e.g. wiki.example.org=http://127.0.0.1:8002 ([[sites]])",
    )


def settings_of(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> Settings:
    return load_settings(args.config, os.environ, overrides)


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Settings given as command-line flags, as dotted keys (they win over file and environment)."""
    named = getattr(args, "site", None) or ()
    profiles, pairs = [text for text in named if "=" not in text], [text for text in named if "=" in text]
    flags = {
        "server.origin": getattr(args, "origin", None),
        "server.public_url": getattr(args, "public_url", None),
        "cache.sites": tuple(profiles) if profiles else None,
        "sites": [_site_flag(text) for text in pairs] if pairs else None,
        "cache.storage_mode": "rfc9111" if getattr(args, "strict", False) else None,
        "server.host": getattr(args, "host", None),
        "server.port": getattr(args, "port", None),
        "server.workers": getattr(args, "workers", None),
        "l1.memcached": tuple(args.memcached) if getattr(args, "memcached", None) else None,
        "l2.cache_dir": getattr(args, "cache_dir", None),
    }
    return {key: value for key, value in flags.items() if value is not None}


def _site_flag(text: str) -> dict[str, Any]:
    """``--site HOSTS=ORIGIN``: one of several sites, as a ``[[sites]]`` table."""
    hosts, _, origin = text.partition("=")
    return {"hosts": [host for host in hosts.split(",") if host.strip()], "origin": origin}


def text_out(args: argparse.Namespace) -> TextIO:
    """Where the human-readable report goes: standard output, unless the JSON goes there."""
    return sys.stderr if getattr(args, "json", None) == "-" else sys.stdout


def write_json(target: str, data: Any) -> None:
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if target == "-":
        sys.stdout.write(text)
    else:
        write_text(Path(target), text)


def write_text(target: Path, text: str) -> None:
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CrawlerGateError(f"Cannot write '{target}': {exc.strerror}.") from None


def number_argument(convert: Callable[[str], Any], accept: Callable[[Any], bool], rule: str) -> Callable[[str], Any]:
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


positive_int = number_argument(int, lambda value: value > 0, "a positive integer")


positive_float = number_argument(float, lambda value: 0 < value < math.inf, "a positive number")


fraction = number_argument(float, lambda value: 0 <= value <= 1, "a number from 0 to 1")


non_negative_int = number_argument(int, lambda value: value >= 0, "0 or a positive integer")


non_negative_float = number_argument(float, lambda value: 0 <= value < math.inf, "0 or a positive number")


port_number = number_argument(int, lambda value: 0 < value < 65536, "a port number from 1 to 65535")


def open_agents_log(path: Path, log_format: str = "auto") -> LogReader:
    """A reader of an access log whose format is known (detected or given) and records user agents, after one line
    saying which format it is."""
    reader = LogReader(path, log_format)
    print(f"{path.name}: read as {reader.format.description}", file=sys.stderr)
    if not reader.format.has_user_agent:
        raise CrawlerGateError(
            f"Log file '{path}' records no user agents ({reader.format.description}), so crawlers cannot be "
            "told from people in it. Log them: nginx/Apache 'combined', IIS cs(User-Agent), Traefik "
            "accessLog.fields.headers.names.User-Agent=keep."
        )
    return reader


def after_reading(reader: LogReader) -> None:
    """Refuse a log of which no line was a request; warn about a damaged or partly unreadable one."""
    reader.require_requests()
    for warning in reader.warnings():
        print(f"warning: {warning}", file=sys.stderr)


def progress_bytes(progress: Progress) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        progress.total = total
        progress.update(done)

    return report
