"""A `serve` worker's own process: what it tunes of the system for itself (crawlergate/adapters/server.py)."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from tests.conftest import ServerThread, free_port, wait_until_healthy
from tests.visitors import GOOGLEBOT

# In a process of its own, so the test run's allocator stays as it was: the heap's end (sbrk(0)) before a
# 3 MB allocation, with it, and once it is freed.
HEAP_END = """
import ctypes, sys
from crawlergate.adapters.server import keep_freed_heap
if sys.argv[1] == "tuned":
    keep_freed_heap()
libc = ctypes.CDLL(None)
libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]
before = libc.sbrk(0)
block = bytearray(3 * 1024 * 1024)
during = libc.sbrk(0)
del block
after = libc.sbrk(0)
print(during - before >= 2 * 1024 * 1024, after == during)  # the heap may have had some of it free
"""


def _heap_end(mode: str, **operator: str) -> str:
    """The script's answer in a process whose environment holds no allocator settings but ``operator``'s."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith(("MALLOC_", "GLIBC_"))}
    run = subprocess.run([sys.executable, "-c", HEAP_END, mode], capture_output=True, text=True, check=True,
                         env=environment | operator)  # fmt: skip
    return run.stdout


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallopt") or not sys.platform.startswith("linux"), reason="glibc")
def test_a_worker_keeps_the_memory_it_frees_for_the_next_request() -> None:
    # glibc's defaults: a 3 MB block is a mapping of its own, given back (and faulted in again) every time.
    assert _heap_end("default").split() == ["False", "True"]
    # Tuned: it comes from the heap, and the heap keeps it once freed.
    assert _heap_end("tuned").split() == ["True", "True"]
    # An operator who set glibc's own variables keeps what they set (here its default threshold).
    assert _heap_end("tuned", MALLOC_MMAP_THRESHOLD_="131072").split() == ["False", "True"]
    assert _heap_end("tuned", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072").split() == ["False", "True"]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a parent that does not reap it has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _is_worker(pid: int) -> bool:
    """A worker uvicorn spawned, not multiprocessing's resource tracker (which ends with the workers' pipes)."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return b"spawn_main" in cmdline.read()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_stop_when_their_master_is_killed_alone(tmp_path: Path) -> None:
    port = free_port()
    argv = ["serve", "--origin", "http://127.0.0.1:9", "--port", str(port), "--workers", "2"]
    master = subprocess.Popen(
        [sys.executable, "-m", "crawlergate", *argv, "--cache-dir", str(tmp_path / "l2")],
        stderr=subprocess.DEVNULL,
        env={key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")},
    )
    try:
        wait_until_healthy(master, f"http://127.0.0.1:{port}")
        with open(f"/proc/{master.pid}/task/{master.pid}/children") as children:
            workers = [int(pid) for pid in children.read().split() if _is_worker(int(pid))]
        assert workers
    finally:
        master.kill()  # a supervisor's SIGKILL to the master alone
        master.wait(timeout=10)
    deadline = time.monotonic() + 30  # a worker still starting stops once it has started
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []
    with socket.create_server(("127.0.0.1", port)):  # the next start can listen
        pass


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_flags_win_over_variables_in_every_worker(tmp_path: Path, workers: int) -> None:
    """Workers build their app from the settings the master made: variables read there again undid the flags
    (CRAWLERGATE_SERVER_ORIGIN beside --origin) or failed after "listening on" (a bad value a flag replaced)."""
    site = ServerThread(Starlette(routes=[Route("/{path:path}", lambda request: HTMLResponse("<p>right</p>"))]))
    site.start()
    port = free_port()
    argv = ["serve", "--origin", site.url, "--port", str(port), "--workers", str(workers)]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    wrong = {"CRAWLERGATE_SERVER_ORIGIN": "http://127.0.0.1:1", "CRAWLERGATE_SERVER_PORT": "abc"}
    gate = subprocess.Popen(
        [sys.executable, "-m", "crawlergate", *argv, "--cache-dir", str(tmp_path / "l2")],
        stderr=subprocess.DEVNULL,
        env=environment | wrong,
    )
    try:
        wait_until_healthy(gate, f"http://127.0.0.1:{port}")
        page = httpx.get(f"http://127.0.0.1:{port}/t/1", headers=GOOGLEBOT)
    finally:
        gate.send_signal(signal.SIGTERM)
        gate.wait(timeout=30)
        site.stop()
    assert page.headers["x-crawlergate"] == "miss" and page.text == "<p>right</p>"
