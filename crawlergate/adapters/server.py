"""Running the standalone proxy on uvicorn: pre-flight checks, the start-up line, workers.

Start-up is loud: a bad origin URL, an unusable cache directory or a port in use stop it with
one line before uvicorn starts. Workers are uvicorn processes that each build the app from the
environment (``crawlergate.adapters.proxy:app_from_environment``), so the command-line flags are handed to
them as ``CRAWLERGATE_*`` variables. SIGTERM and SIGINT are graceful: uvicorn stops accepting,
lets in-flight requests finish, then the gate drains its background work; L2 writes are atomic,
so no half-written page can remain.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import uvicorn

from crawlergate.adapters.httpserver import HeadLimits, LimitedHttpToolsProtocol
from crawlergate.classify import Classifier
from crawlergate.config import ENV_PREFIX, Settings
from crawlergate.errors import ConfigError
from crawlergate.gate.accesslog import open_log
from crawlergate.keys import KeyMaker
from crawlergate.metrics import Metrics, clear_shared
from crawlergate.regenerate.window import check_window
from crawlergate.stores.owner import claim_folder
from crawlergate.suspect.judge import Judge
from crawlergate.wiring import access_log_path, build_cache

# Seconds uvicorn lets in-flight requests finish after SIGTERM before it closes them.
GRACEFUL_SHUTDOWN_S = 30
# How long start-up waits for the origin to accept a connection before it warns that nothing answers there.
ORIGIN_PROBE_S = 2.0
# Connections the kernel queues before the server accepts them (nginx's default is 511).
BACKLOG = 2048
# How often a worker of `serve --workers N` looks whether the master that started it is still there, and where
# the master writes its pid for them (outside CRAWLERGATE_*, which are settings).
MASTER_CHECK_S = 1.0
MASTER_PID_VARIABLE = "_CRAWLERGATE_SERVE_MASTER_PID"
# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Free memory at the top of the heap a worker keeps rather than give back at once: a fill's gzip takes and frees
# 256 KB of zlib state, which glibc returned to the system each time and faulted in again (a 6 KB page took
# 92 us to compress here, 31 us with the memory kept).
HEAP_KEPT_BYTES = 8 * 1024 * 1024
# Allocations under this come from the heap rather than a mapping of their own (and its page faults): a large
# page's bytes, each time it is read or filled.
HEAP_ALLOCATION_MAX = 4 * 1024 * 1024
# glibc's own variables for its allocator: an operator who set one keeps glibc's behaviour as set.
_OPERATOR_MALLOC = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def check_site_settings(site: Settings) -> None:
    """Raise ConfigError for what a site's workers would refuse: a bad cron expression, broken cache rules,
    profiles, evidence, policy or ranges files. Found here it is one line, not a traceback in each worker (which
    would restart forever); `check` asks the same before an upgrade restarts the gate."""
    check_window(site.regenerate)
    KeyMaker.from_settings(site)
    families = [family.name for family in Classifier.from_settings(site.classify).ruleset.families]
    Judge.from_settings(site, Metrics(), families)


def run_proxy(settings: Settings) -> int:
    """Check the settings, print where the proxy listens, and serve until a signal stops it."""
    server = settings.server
    if not server.origin and not settings.sites:
        raise ConfigError(
            "No origin: give --origin URL (or the setting server.origin), e.g. --origin http://127.0.0.1:8000."
        )
    if server.origin and settings.sites:
        raise ConfigError(
            "Give one site's --origin or several sites (--site HOST=ORIGIN, [[sites]]), not both: with several "
            "sites, server.other_hosts says what a request for another host gets."
        )
    sites = [settings.for_site(site) for site in settings.sites] or [settings]
    stored = []
    for site in sites:
        check_site_settings(site)
        claim_folder(site.cache_dir, site.folder_owner())  # another site's folder: one line, before anything
        cache = build_cache(site, Metrics())
        cache.start()  # creates and indexes L2, or fails loudly
        stored.append(f"L2 {site.cache_dir} ({len(cache.l2):,} pages, {cache.l2.used_bytes / 1e6:.1f} MB)")
        cache.close()
    _check_port(server.host, server.port)
    for site in sites:
        _warn_if_origin_is_silent(site.server.origin)
    _warn_if_memcached_is_silent(server for site in sites for server in site.l1.memcached)
    logs = [path for site in sites if (path := access_log_path(site, standalone=True)) is not None]
    for path in logs:
        os.close(open_log(path))  # an unwritable log stops serve here, in one line, before it listens
    with _shared_metrics(settings) as settings:
        return _serve(settings, stored, logs)


@contextlib.contextmanager
def _shared_metrics(settings: Settings) -> Iterator[Settings]:
    """The settings with a folder where every worker keeps its counters, emptied for this run (a fresh
    temporary one unless metrics.shared_dir names one), so stats and metrics sum the workers of this run."""
    if settings.metrics.shared_dir:
        for site in [settings.for_site(site) for site in settings.sites] or [settings]:
            clear_shared(Path(site.metrics.shared_dir))
        yield settings
        return
    folder = tempfile.mkdtemp(prefix="crawlergate-metrics-")
    try:
        yield dataclasses.replace(settings, metrics=dataclasses.replace(settings.metrics, shared_dir=folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _serve(settings: Settings, stored: list[str], logs: list[Path]) -> int:
    server = settings.server
    # Workers build their app from the environment: these settings, whole, as one serialised value, and nothing
    # else (the file and the variables they were made from, read again there, would undo the flags).
    for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
        del os.environ[name]
    os.environ.update(settings.to_environ())
    os.environ[MASTER_PID_VARIABLE] = str(os.getpid())

    l1 = (
        f"memcached {', '.join(settings.l1.memcached)}"
        if settings.l1.memcached
        else f"embedded LRU of {settings.l1.max_bytes / 2**20:.0f} MiB per worker"
    )
    if settings.sites:
        for site, where in zip(settings.sites, stored, strict=True):
            fills = "" if site.public_url else f" (fills ask for http://{site.name}: set its public_url if https)"
            print(f"crawlergate serve: {', '.join(site.hosts)} -> {site.origin}{fills}; {where}", file=sys.stderr)
        target = f"{len(settings.sites)} sites (other hosts: {server.other_hosts})"
    else:
        target = f"{server.origin}; {stored[0]}"
    print(
        f"crawlergate serve: listening on http://{server.host}:{server.port} for {target}; L1 {l1}; "
        f"{server.workers} worker{'s' if server.workers > 1 else ''}; "
        f"access log {', '.join(map(str, logs)) or 'off'}",
        file=sys.stderr,
        flush=True,
    )
    if not server.public_url and not settings.sites:
        print(
            f"crawlergate serve: warning: server.public_url is not set, so guest fills ask {server.origin} for "
            "pages with its own address as Host, and the site may build links and redirects to it. Give "
            "--public-url https://your.site (the address crawlers use).",
            file=sys.stderr,
            flush=True,
        )
    HeadLimits.apply(server)
    _raise_open_files_limit()
    stopped_by: list[int] = []
    # uvicorn shuts down gracefully on these, then re-raises them; handlers of ours turn that into exit 0.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda number, frame: stopped_by.append(number))
    uvicorn.run(
        "crawlergate.adapters.proxy:app_from_environment",
        factory=True,
        host=server.host,
        port=server.port,
        workers=server.workers,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # X-Forwarded-* are judged once, by ReverseProxy against server.trusted_proxies.
        proxy_headers=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        http=LimitedHttpToolsProtocol,
        limit_concurrency=server.max_connections,
        backlog=BACKLOG,
        timeout_keep_alive=server.keep_alive_seconds,
    )
    reason = f" on {signal.Signals(stopped_by[0]).name}" if stopped_by else ""
    print(f"crawlergate serve: stopped{reason}", file=sys.stderr, flush=True)
    return 0


def _raise_open_files_limit() -> None:
    """Let the server hold as many sockets as the system allows (nginx's worker_rlimit_nofile): a soft limit
    of 1,024 is what a slowloris exhausts first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))


def stop_with_master(environment: Mapping[str, str] = os.environ) -> None:
    """Stop this worker as SIGTERM does (gracefully) once the master that started it is gone. A master killed
    alone (a supervisor's SIGKILL to one process) would leave its workers answering on the port, and the next
    start could not listen on it; gunicorn's workers leave too. The master's pid comes from the environment it
    set: a worker still starting when the master died has another parent already."""
    master = int(environment.get(MASTER_PID_VARIABLE, "0")) or os.getppid()

    def watch() -> None:
        while os.getppid() == master:
            time.sleep(MASTER_CHECK_S)
        print(
            f"crawlergate serve [{os.getpid()}]: its master process {master} is gone: stopping",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="crawlergate-master-watch", daemon=True).start()


def keep_freed_heap(environment: Mapping[str, str] = os.environ) -> None:
    """Have glibc keep freed memory for the next request (``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_MMAP_THRESHOLD_``,
    set from within): a worker's own process, so its allocator is the gate's to tune. Nothing elsewhere (musl,
    macOS), nor where the operator tuned glibc's allocator in the environment (those variables, ``GLIBC_TUNABLES``).
    """
    tunables = environment.get("GLIBC_TUNABLES", "")
    if any(name in environment for name in _OPERATOR_MALLOC) or "glibc.malloc." in tunables:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_TRIM_THRESHOLD, HEAP_KEPT_BYTES)
    mallopt(_M_MMAP_THRESHOLD, HEAP_ALLOCATION_MAX)


def _warn_if_origin_is_silent(origin: str) -> None:
    """Say at start-up when nothing answers at the origin's address (people would get 502 until it does);
    not an error: the site may start after the gate."""
    address = urllib.parse.urlsplit(origin)
    port = address.port or (443 if address.scheme == "https" else 80)
    silent = _silence_at(address.hostname or "", port)
    if silent:
        _warn(f"nothing answers at {origin} ({silent}): people get 502 and crawlers their stored pages until the "
              "site listens there.")  # fmt: skip


def _warn_if_memcached_is_silent(servers: Iterable[str]) -> None:
    """Say at start-up when a memcached server of L1 does not answer (crawlers' pages come from L2 and the site
    meanwhile); not an error: memcached may start after the gate."""
    for server in dict.fromkeys(servers):
        host, _, port = server.rpartition(":")
        silent = _silence_at(host.strip("[]"), int(port))
        if silent:
            _warn(f"memcached at {server} does not answer ({silent}): L1 stores nothing, and crawlers get their "
                  "pages from L2 and the site, until it does.")  # fmt: skip


def _silence_at(host: str, port: int) -> str:
    """Why nothing accepts a connection at ``host``:``port`` within ORIGIN_PROBE_S; "" when something does."""
    try:
        socket.create_connection((host, port), timeout=ORIGIN_PROBE_S).close()
    except OSError as exc:
        return str(exc.strerror or exc)
    return ""


def _warn(sentence: str) -> None:
    print(f"crawlergate serve: warning: {sentence}", file=sys.stderr, flush=True)


def _check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.") from None
