from __future__ import annotations

import contextlib
import ctypes
import gzip
import mmap
import os
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from crawlergate.adapters.proxy import create_app
from crawlergate.classify import Classifier
from crawlergate.config import CacheSettings, ClassifySettings, L2Settings, ServerSettings, Settings
from crawlergate.demo.run import free_port

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session", autouse=True)
def own_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test, nor a process it starts, may fill the user's own cache folder (the default L2)."""
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache-home"))
    # Nor may a `serve` a test starts regenerate on the wall clock (an 04:00 window mid-test): tests that
    # want a window set one, on an injected clock or in their own environment.
    os.environ["CRAWLERGATE_REGENERATE_ENABLED"] = "false"
    yield
    del os.environ["CRAWLERGATE_REGENERATE_ENABLED"]
    if previous is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = previous


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Default settings with the L2 cache under the test's own temporary directory."""
    return Settings(l2=L2Settings(cache_dir=str(tmp_path / "cache")))


@pytest.fixture(scope="session")
def classifier() -> Classifier:
    return Classifier.from_settings(ClassifySettings())


@pytest.fixture(scope="session")
def paper_classifier() -> Classifier:
    """The paper's Heuristic 1 alone."""
    return Classifier.from_settings(ClassifySettings(rule_files=("heuristic.toml",)))


def read_user_agents(name: str) -> list[str]:
    lines = (DATA / "user_agents" / name).read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def read_corpus(name: str) -> list[tuple[str, str]]:
    """(kind or set, user agent) of a corpus file built by scripts/build_ua_corpus.py (kind, source, user agent)."""
    with gzip.open(DATA / "user_agents" / name, "rt", encoding="utf-8") as handle:
        rows = (line.rstrip("\n").split("\t", 2) for line in handle if not line.startswith("#"))
        return [(row[0], row[2]) for row in rows if len(row) == 3]


@pytest.fixture(scope="session")
def nginx_binary() -> str:
    """Debian's nginx; CI installs it, elsewhere its tests are skipped without it."""
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is needed (apt-get install nginx); CI installs it")
        pytest.skip("nginx is not installed (apt-get install nginx)")
    return binary


class MemcachedServer:
    """A real memcached process on a free loopback port."""

    def __init__(self, memory_mb: int = 64) -> None:
        self.memory_mb = memory_mb
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = shutil.which("memcached")
        if binary is None:
            pytest.fail("memcached is not installed (apt-get install -y memcached); CI installs it")
        self.process = subprocess.Popen(
            [binary, "-l", "127.0.0.1", "-p", str(self.port), "-m", str(self.memory_mb), "-U", "0", "-u", "root"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        pytest.fail("memcached did not start")

    def pause(self) -> None:
        """Stop the process (hung, not gone) and wait until every thread of it has stopped.

        SIGSTOP reaches each thread when it next runs: a worker thread woken by a request
        at that moment may still answer it unless we wait.
        """
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        tasks = Path(f"/proc/{self.process.pid}/task")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()]
            if all(state in "Tt" for state in states):
                return
            time.sleep(0.01)
        pytest.fail("memcached did not stop")

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def memcached_server() -> Iterator[MemcachedServer]:
    server = MemcachedServer()
    server.start()
    yield server
    server.stop()


class ServerThread:
    """A real uvicorn server on a free loopback port, in a background thread."""

    def __init__(self, app: Any, port: int | None = None, **options: Any) -> None:
        self.port = port or free_port()
        # proxy_headers off, as `crawlergate serve` runs it: X-Forwarded-* are the gate's to judge.
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on", proxy_headers=False, **options
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                pytest.fail("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def proxy_thread(origin: str, tmp_path: Path, *, cache: CacheSettings | None = None, **server: object) -> ServerThread:
    """``create_app`` (the standalone proxy) in front of ``origin`` on uvicorn, its L2 under ``tmp_path``."""
    settings = Settings(
        server=ServerSettings(origin=origin, **server),  # type: ignore[arg-type]
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        cache=cache or CacheSettings(max_stale_seconds=0),
    )
    return ServerThread(create_app(settings)).start()


def out_of_memory(path: Path) -> None:
    """Have the system drop a file's pages from its memory, as after a restart: reading it waits for the disk.

    The system may keep a page for a moment (one still being written back, or held by another CPU's list), so this
    asks again until mincore(2) finds none of the file's pages in memory."""
    descriptor = os.open(path, os.O_RDWR)
    try:
        for _ in range(50):
            os.fsync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            if not _pages_in_memory(descriptor):
                return
            time.sleep(0.02)
        raise AssertionError(f"the system keeps {path} in memory")
    finally:
        os.close(descriptor)


def dropped_until_a_read_waits(path: Path, read_waited: Callable[[], bool], tries: int = 20) -> None:
    """Drop a file's pages from the system's memory and read it with ``read_waited`` until that read had to wait for
    the disk; skip the test when none did.

    A read that must not wait starts the disk's read ahead, and a virtual disk backed by its host's memory can finish
    it within that very read, which then succeeds at once: on such a machine a read that waits cannot be made."""
    for _ in range(tries):
        out_of_memory(path)
        if read_waited():
            return
    pytest.skip(f"this disk finished each of {tries} reads within the read that must not wait")


def _pages_in_memory(descriptor: int) -> int:
    """How many of a file's pages the system holds in memory (mincore(2) on a mapping, which reads nothing)."""
    size = os.fstat(descriptor).st_size
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    flags = (ctypes.c_ubyte * ((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
    mapping = mmap.mmap(descriptor, size)
    try:
        start = ctypes.c_char.from_buffer(mapping)
        answer = libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), flags)
        del start  # the mapping closes only once nothing points into it
    finally:
        mapping.close()
    if answer != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(flag & 1 for flag in flags)


def reads_without_waiting(folder: Path) -> bool:
    """Whether the file system under ``folder`` answers a read that must not wait (ext4 and xfs do; tmpfs not)."""
    probe = folder / ".probe-nowait"
    probe.write_bytes(b"x")
    descriptor = os.open(probe, os.O_RDONLY)
    try:
        os.preadv(descriptor, (bytearray(1),), 0, os.RWF_NOWAIT)
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)
        probe.unlink()


def exit_code_of(child: int, seconds: float = 20) -> int | None:
    """A forked child's exit code; None (and the child killed) when it did not end within ``seconds``."""
    deadline = time.monotonic() + seconds
    while (status := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if status[0] == 0:
        os.kill(child, 9)
        os.waitpid(child, 0)
        return None
    return os.waitstatus_to_exitcode(status[1])


def wait_until_healthy(process: subprocess.Popen[Any], url: str, *, seconds: float = 60) -> None:
    """Wait until the gate a process started answers ``healthz`` at ``url``; fails if the process ends first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            httpx.get(url + "/_crawlergate/healthz")
            return
        except httpx.TransportError:
            assert process.poll() is None and time.monotonic() < deadline, "the gate did not start"
            time.sleep(0.1)


@contextlib.contextmanager
def serve_process(
    origin: str, tmp_path: Path, config_text: str = "", *, workers: int = 1, args: tuple[str, ...] = ()
) -> Iterator[str]:
    """``crawlergate serve`` in its own process with a config file, its base URL once it answers."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "gate.toml"
    config.write_text(config_text)
    port = free_port()
    argv = ["serve", "--origin", origin, "--port", str(port), "--workers", str(workers), "--config", str(config)]
    process = subprocess.Popen(
        [sys.executable, "-m", "crawlergate", *argv, "--cache-dir", str(tmp_path / "l2"), *args],
        stderr=subprocess.DEVNULL,
        env={key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")},
    )
    try:
        wait_until_healthy(process, f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


class RawHttpServer:
    """An HTTP/1.1 server on a raw socket that answers as told, for origins that misbehave on purpose.

    ``answer(method, path)`` gives the bytes to send (a list: pieces sent 50 ms apart) and whether to close
    the connection after them (True, or "reset" to close it with a TCP reset, as a crashed worker's is); each
    connection serves at most 100 requests, and ``accepted`` counts the connections.
    """

    def __init__(self, answer: Callable[[bytes, bytes], tuple[bytes | list[bytes], bool | str]]) -> None:
        self.answer = answer
        self.port = free_port()
        self.accepted = 0
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RawHttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._server.close()

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            threading.Thread(target=self._connection, args=(connection,), daemon=True).start()

    def _connection(self, connection: socket.socket) -> None:
        connection.settimeout(5)
        buffer = b""
        with connection:
            for _ in range(100):
                while b"\r\n\r\n" not in buffer:
                    try:
                        chunk = connection.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                method, path = head.split(b" ")[:2]
                data, close = self.answer(method, path)
                for number, piece in enumerate([data] if isinstance(data, bytes) else data):
                    if number:
                        time.sleep(0.05)
                    try:
                        connection.sendall(piece)
                    except OSError:
                        return  # the gate left mid-answer (a fill past the page size limit aborts its connection)
                if close == "reset":
                    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                if close:
                    return


class CountedSteps:
    """A connection that counts its SQLite steps, each of which lets the GIL go (a thread beside a busy event loop
    waits for it again at each, so bulk reads and writes must take as many for 2,000 rows as for 3): a statement's
    run (``executemany`` runs one per row), and each row it gives back after the first."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.steps = 0

    def execute(self, sql: str, parameters: Sequence[object] = ()) -> ReadRows:
        cursor = self.connection.execute(sql, parameters)
        rows = cursor.fetchall()
        self.steps += max(1, len(rows))
        return ReadRows(rows, cursor.rowcount)

    @property
    def in_transaction(self) -> bool:
        return self.connection.in_transaction

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        listed = list(rows)
        self.steps += len(listed)
        self.connection.executemany(sql, listed)


class ReadRows:
    """The rows a counted statement gave, as its cursor would give them."""

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows

    def __iter__(self) -> Any:
        return iter(self.rows)
