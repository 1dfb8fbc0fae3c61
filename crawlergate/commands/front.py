"""The front server's command: nginx-config."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from crawlergate.classify import Classifier
from crawlergate.commands.common import (
    EXIT_FAILURE,
    EXIT_OK,
    add_settings_flags,
    add_site_flags,
    after_reading,
    flag_overrides,
    open_agents_log,
    progress_bytes,
    settings_of,
)
from crawlergate.errors import ConfigError
from crawlergate.front.nginx import (
    HASH_FILE,
    HTTP_FILE,
    MAX_KNOWN_AGENTS,
    SERVER_FILE,
    count_user_agents,
    nginx_include,
    published_tree,
)
from crawlergate.progress import Progress
from crawlergate.rules import load_site_profiles
from crawlergate.tools.logparse import AUTO, LogReader

DEFAULT_DIRECT_LOG = "/var/log/nginx/crawlergate-direct.log"


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The sub-commands of this family, added to the top parser's."""
    config = commands.add_parser(
        "nginx-config",
        help="write the nginx include that answers announced crawlers from the published tree",
        description="Write an nginx include, generated from the active rules and settings, with which nginx answers "
        "announced crawlers from the gate's published tree (front.publish) and sends everyone else to the gate: "
        f"{HASH_FILE} for the top of the http block, {HTTP_FILE} for the http block, {SERVER_FILE} for the server "
        "block.",
    )
    add_site_flags(config)
    add_settings_flags(config, cache=True)
    config.add_argument(
        "--out", type=Path, default=Path("."), help="the folder to write the three files to (default .)"
    )
    config.add_argument(
        "--gate", help="the gate's address as nginx reaches it (default: server.host:server.port, 127.0.0.1:8080)"
    )
    config.add_argument(
        "--direct-log",
        help=f"where nginx logs its direct hits (default: front.direct_log, else {DEFAULT_DIRECT_LOG})",
    )
    config.add_argument(
        "--agents-from",
        metavar="LOG",
        type=Path,
        action="append",
        default=[],
        help=f"an access log of the site (nginx, Apache, Caddy, IIS, the gate's own; plain or gzip; repeatable): the "
        f"crawlers' user agents it holds most, up to {MAX_KNOWN_AGENTS:,}, are found by a hash lookup instead of the "
        "patterns, which cost nginx about half its direct hits (default: none; the patterns alone)",
    )
    config.add_argument(
        "--format",
        default=AUTO,
        help="the format of the --agents-from logs (each of them): auto (detected: nginx/Apache text, JSON lines, "
        "W3C), a preset, json:FIELD=NAME,..., or an Apache LogFormat / nginx log_format string (see classify --help)",
    )
    config.set_defaults(handler=_run_nginx_config)


def _run_nginx_config(args: argparse.Namespace) -> int:
    settings = settings_of(args, flag_overrides(args))
    profiles = load_site_profiles(settings.classify.rules_dir, settings.cache.sites)
    classifier = Classifier.from_settings(
        settings.classify, extra_session_cookies=[name for profile in profiles for name in profile.session_cookies]
    )
    gate = args.gate or _gate_address(settings.server.host, settings.server.port)
    direct_log = args.direct_log or settings.front.direct_log or DEFAULT_DIRECT_LOG
    if args.format != AUTO and not args.agents_from:
        raise ConfigError("--format says how to read the --agents-from logs: give one, or leave --format out.")
    published_tree(settings, Path(direct_log))  # what stops the command, said before the logs are read
    seen = _user_agents(args.agents_from, args.format) if args.agents_from else None
    include = nginx_include(settings, gate=gate, direct_log=Path(direct_log), classifier=classifier, seen=seen)
    if seen is not None:
        print(f"crawler user agents found by a hash lookup: {len(include.known_agents):,}", file=sys.stderr)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, text in include.files.items():
            (args.out / name).write_text(text)
    except OSError as exc:
        print(f"crawlergate: cannot write the include to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILURE
    folder = args.out.resolve()
    print(f"wrote {folder / HASH_FILE}, {folder / HTTP_FILE} and {folder / SERVER_FILE}; in nginx.conf:")
    print(f"    http   {{ include {folder / HASH_FILE};  (first, before any map)")
    print(f"             include {folder / HTTP_FILE}; ... }}")
    print(f"    server {{ include {folder / SERVER_FILE}; ... }}")
    print("and in the gate's settings:")
    print(f'    [front]\n    publish = true\n    direct_log = "{direct_log}"')
    if not settings.front.publish:
        print("(front.publish is off in these settings: nginx finds no page until the gate publishes them)")
    return EXIT_OK


def _user_agents(logs: list[Path], given_format: str) -> Counter[str]:
    """How often each user agent asked for something in ``logs`` (read as ``given_format``: ``--format``)."""
    counts: Counter[str] = Counter()
    for log in logs:
        log_format = open_agents_log(log, given_format).format
        with Progress(f"reading {log.name}", total=1, unit="B") as progress:
            reader = LogReader(log, log_format, on_progress=progress_bytes(progress))
            count_user_agents((record.user_agent for record in reader), counts)
        after_reading(reader)
    return counts


def _gate_address(host: str, port: int) -> str:
    """Where nginx reaches a gate listening on ``host``: loopback for a wildcard address, brackets for IPv6."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
