"""``crawlergate demo``, and its sub-commands forum and trace."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crawlergate.commands.common import (
    EXIT_OK,
    DefaultsShown,
    add_settings_flags,
    fraction,
    non_negative_float,
    port_number,
    positive_float,
    positive_int,
    settings_of,
)
from crawlergate.progress import Progress


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The sub-commands of this family, added to the top parser's."""
    demo = commands.add_parser(
        "demo",
        help="run the paper's experiment here: the demo forum, crawlergate in front, a trace replayed through both",
        description="Without a sub-command: start the demo forum and crawlergate on loopback, warm L2, replay a "
        "synthetic trace straight to the forum and through crawlergate, print the comparison and an HTML report.",
    )
    demo.add_argument("--threads", type=positive_int, default=1000, help="threads in the forum")
    demo.add_argument("--requests", type=positive_int, default=1600, help="page views in the replayed trace")
    demo.add_argument(
        "--work-ms", type=non_negative_float, default=20.0, help="CPU work per dynamic page, in milliseconds"
    )
    demo.add_argument("--concurrency", type=positive_int, default=8, help="replay clients")
    demo.add_argument("--dir", type=Path, help="keep the run's files here (default: a new temporary folder)")
    demo.add_argument("--serve", action="store_true", help="leave the forum and the gate running afterwards")
    demo.add_argument(
        "--front",
        choices=("nginx",),
        help="put nginx with crawlergate's include in front (needs nginx): announced crawlers are answered from "
        "the published tree, the forum's pages at plain URLs (default: none)",
    )
    add_settings_flags(demo)
    demo.set_defaults(handler=_run_demo)
    demo_commands = demo.add_subparsers(dest="demo_command", metavar="DEMO_COMMAND")
    forum = demo_commands.add_parser(
        "forum", help="serve the demo forum (Starlette + SQLite) on its own", formatter_class=DefaultsShown
    )
    forum.add_argument("--host", default="127.0.0.1", help="address to listen on")
    forum.add_argument("--port", type=port_number, default=8000, help="port to listen on")
    _add_forum_flags(forum)
    forum.set_defaults(handler=_run_demo_forum)
    trace = demo_commands.add_parser(
        "trace", help="write a synthetic access log of the demo forum", formatter_class=DefaultsShown
    )
    trace.add_argument("--out", type=Path, required=True, help="the log file to write")
    trace.add_argument("--requests", type=positive_int, default=20_000, help="page views in the trace")
    trace.add_argument(
        "--duration", type=positive_float, default=86_400.0, help="seconds the trace spans (default a day)"
    )
    trace.add_argument("--crawler-share", type=fraction, default=0.68, help="crawler share of page views")
    _add_forum_flags(trace)
    trace.set_defaults(handler=_run_demo_trace)


def _add_forum_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=positive_int, default=3000, help="threads to seed (the paper's: 153100)")
    parser.add_argument(
        "--work-ms", type=non_negative_float, default=20.0, help="CPU work per dynamic page, in milliseconds"
    )
    parser.add_argument("--seed", type=int, default=2012, help="seed of the forum's content and of the trace")
    parser.add_argument("--db", type=Path, help="the SQLite file (default: in the user's cache folder)")


def _run_demo(args: argparse.Namespace) -> int:
    from crawlergate.demo.run import DemoSpec, run_demo

    spec = DemoSpec(
        threads=args.threads,
        requests=args.requests,
        work_ms=args.work_ms,
        concurrency=args.concurrency,
        front=args.front or "",
    )
    return run_demo(spec, settings_of(args), args.dir, serve=args.serve)


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
