"""The L2 disk store: pages in sharded folders under a size cap, evicted least recently served, kept whole
through crashes, full disks, damaged indexes and several processes (forked ones too) sharing the folder."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from crawlergate.errors import ConfigError, StoreUnavailable
from crawlergate.stores import disk
from crawlergate.stores.disk import EVICT_BATCH, INDEX_FILE, DiskStore
from crawlergate.stores.l2index import IndexWrite
from crawlergate.stores.mounts import IN_MEMORY, file_system_type
from tests.conftest import dropped_until_a_read_waits, exit_code_of, reads_without_waiting

KEY_A = "a" * 32
KEY_B = "b" * 32
KEY_C = "c" * 32


def test_disk_store_roundtrip_in_sharded_folders(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, max_bytes=10_000)
    store.start()
    store.set(KEY_A, b"page")
    assert store.get(KEY_A) == b"page"
    assert store.path_for(KEY_A) == tmp_path / "aa" / f"{KEY_A}.page"
    store.delete(KEY_A)
    assert store.get(KEY_A) is None
    assert store.used_bytes == 0


def test_disk_store_reads_at_once_only_a_page_the_system_holds_in_memory(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, max_bytes=100_000)
    store.start()
    store.set(KEY_A, b"page" * 100)
    assert store.get_at_once(KEY_B, 10_000) is None  # no such page: nothing to wait for
    assert store.get_at_once(KEY_A, 100) is False  # larger than an event loop reads: a thread's
    if not reads_without_waiting(tmp_path):  # a file system that cannot say (NFS, overlayfs): a thread's
        assert store.get_at_once(KEY_A, 10_000) is False
        assert store.get_at_once(KEY_A, 10_000) is (b"page" * 100 if file_system_type(tmp_path) in IN_MEMORY else False)
        return
    assert store.get_at_once(KEY_A, 10_000) == b"page" * 100
    # On the disk only: reading it would wait (or the disk answered within the read, which then has the page).
    dropped_until_a_read_waits(store.path_for(KEY_A), lambda: store.get_at_once(KEY_A, 10_000) is False)
    assert store.get(KEY_A) == b"page" * 100
    assert store.get_at_once(KEY_A, 10_000) == b"page" * 100  # read once, in memory again


@pytest.fixture
def memory_folder() -> Iterator[Path]:
    """A folder on tmpfs (/dev/shm), where the kernel cannot say whether a read would wait."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or file_system_type(shm) not in IN_MEMORY or not os.access(shm, os.W_OK):
        pytest.skip("no writable tmpfs at /dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="crawlergate-test-", dir=shm))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_disk_store_on_tmpfs_reads_pages_at_once(memory_folder: Path) -> None:
    store = DiskStore(memory_folder, max_bytes=100_000)
    store.start()
    try:
        store.set(KEY_A, b"page" * 100)
        assert not reads_without_waiting(memory_folder)
        store.get_at_once(KEY_A, 10_000)  # the first read learns that the file system cannot say
        assert store.get_at_once(KEY_A, 10_000) == b"page" * 100  # in memory always: no thread
        assert store.get_at_once(KEY_B, 10_000) is None
        assert store.get_at_once(KEY_A, 100) is False  # larger than an event loop reads: still a thread's
    finally:
        store.close()


def test_disk_store_on_overlayfs_reads_in_threads_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A container's own layer (overlayfs) cannot say whether a read would wait: each read is a thread's."""
    layers = {name: tmp_path / name for name in ("lower", "upper", "work", "merged")}
    for folder in layers.values():
        folder.mkdir()
    options = ",".join(f"{name}dir={layers[name]}" for name in ("lower", "upper", "work"))
    mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(layers["merged"])],
                             capture_output=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip("overlayfs cannot be mounted here")
    try:
        store = DiskStore(layers["merged"] / "l2", max_bytes=100_000)
        store.start()
        store.set(KEY_A, b"page" * 100)
        assert store.get_at_once(KEY_A, 10_000) is False
        assert store.get_at_once(KEY_A, 10_000) is False
        assert store.get_at_once(KEY_B, 10_000) is None
        assert store.get(KEY_A) == b"page" * 100
        store.close()
        assert "(overlay) that cannot say whether a read would wait" in caplog.text
        assert "a Docker volume" in caplog.text
    finally:
        subprocess.run(["umount", str(layers["merged"])], check=False)


def test_disk_store_evicts_least_recently_served(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, max_bytes=2 * 4096 + 100)  # two pages: each takes a 4 KB block
    store.start()
    store.set(KEY_A, b"x" * 100)
    store.set(KEY_B, b"x" * 100)
    store.get(KEY_A)
    store.set(KEY_C, b"x" * 100)
    assert store.get(KEY_B) is None
    assert store.get(KEY_A) is not None and store.get(KEY_C) is not None
    assert store.used_bytes == 2 * 4096


def test_disk_store_start_indexes_existing_pages_and_drops_temp_files(tmp_path: Path) -> None:
    first = DiskStore(tmp_path, max_bytes=10_000)
    first.start()
    first.set(KEY_A, b"x" * 10)
    first.close()
    (tmp_path / INDEX_FILE).unlink()  # an older version's folder: pages, no index
    leftover = first.path_for(KEY_A).with_name(".tmp-crashed")
    leftover.write_bytes(b"half a page")
    os.utime(leftover, (time.time() - 120, time.time() - 120))  # a crash's, two minutes ago
    under_way = first.path_for(KEY_A).with_name(".tmp-another-worker")
    under_way.write_bytes(b"being written")
    second = DiskStore(tmp_path, max_bytes=10_000)
    second.start()
    assert second.get(KEY_A) == b"x" * 10  # served before the folder is loaded: a read needs no index
    assert second.wait_loaded(10)
    assert len(second) == 1 and second.used_bytes == 4096 and second.loading() is None
    assert not leftover.exists()
    assert under_way.exists()  # a worker starting beside another never takes its write away


def test_disk_store_load_repairs_what_a_crash_left_between_a_file_and_its_row(tmp_path: Path) -> None:
    first = DiskStore(tmp_path, max_bytes=100_000)
    first.start()
    for key in (KEY_A, KEY_B):
        first.set(key, b"x" * 10)
    first.close()
    first.path_for(KEY_A).unlink()  # a row without its file
    first.path_for(KEY_C).parent.mkdir()
    first.path_for(KEY_C).write_bytes(b"y" * 5000)  # a file without its row
    second = DiskStore(tmp_path, max_bytes=100_000)
    second.start()
    assert second.wait_loaded(10)
    assert sorted(second.digests()) == [KEY_B, KEY_C] and second.used_bytes == 4096 + 8192


def test_disk_store_rebuilds_a_damaged_index_from_the_folder(tmp_path: Path) -> None:
    first = DiskStore(tmp_path, max_bytes=100_000)
    first.start()
    first.set(KEY_A, b"x" * 10)
    first.close()
    (tmp_path / INDEX_FILE).write_bytes(b"not a database at all, garbage " * 200)
    second = DiskStore(tmp_path, max_bytes=100_000)
    second.start()
    assert second.wait_loaded(10)
    assert second.digests() == [KEY_A] and second.get(KEY_A) == b"x" * 10
    assert list(tmp_path.glob(f"{INDEX_FILE}.damaged-*"))


def test_disk_store_unusable_directory_fails_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="not usable"):
        DiskStore(blocker / "cache", max_bytes=100).start()


def test_disk_store_failed_write_keeps_the_old_page(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, max_bytes=10_000)
    store.start()
    store.set(KEY_A, b"old page")
    # A folder where the temporary file should go makes the write fail the way a full disk does.
    temp = store.path_for(KEY_A).with_name(f".tmp-{KEY_A}-{os.getpid()}-{threading.get_ident()}")
    temp.mkdir()
    with pytest.raises(StoreUnavailable):
        store.set(KEY_A, b"new page")
    assert store.get(KEY_A) == b"old page"


def test_disk_store_refuses_pages_over_the_limit(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, max_bytes=10_000, page_max_bytes=10)
    store.start()
    store.set(KEY_A, b"x" * 11)
    assert store.get(KEY_A) is None


def test_disk_store_moves_pages_of_the_old_two_level_layout(tmp_path: Path) -> None:
    old = tmp_path / "aa" / "aa" / f"{KEY_A}.page"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"old layout")
    store = DiskStore(tmp_path, max_bytes=10_000)
    store.start()
    assert store.wait_loaded(10)  # moved by the loader, in the background
    assert store.get(KEY_A) == b"old layout" and not old.exists()


def test_disk_store_cap_holds_for_processes_sharing_the_folder(tmp_path: Path) -> None:
    workers = [DiskStore(tmp_path, max_bytes=10 * 4096) for _ in range(2)]
    for worker in workers:
        worker.start()
    for number in range(16):  # 16 pages of one block, written by two "processes" in turn
        workers[number % 2].set(f"{number:032x}", b"x" * 100)
        on_disk = sum(4096 for _ in tmp_path.rglob("*.page"))
        assert on_disk <= 10 * 4096
        assert workers[0].used_bytes == workers[1].used_bytes == on_disk


def test_disk_store_evicts_by_the_hits_of_every_process(tmp_path: Path) -> None:
    reader, writer = DiskStore(tmp_path, max_bytes=3 * 4096), DiskStore(tmp_path, max_bytes=3 * 4096)
    reader.start()
    writer.start()
    for key in (KEY_A, KEY_B, KEY_C):
        writer.set(key, b"x" * 100)
    reader.get(KEY_A)  # the oldest page, used now by the other process
    reader.close()  # writes its hits, as its housekeeper does every few seconds
    writer.set("d" * 32, b"x" * 100)
    assert writer.get(KEY_B) is None and writer.get(KEY_A) is not None


def test_disk_store_lowered_cap_is_reached_in_the_background(tmp_path: Path) -> None:
    first = DiskStore(tmp_path, max_bytes=10**9)
    first.start()
    for number in range(2 * EVICT_BATCH):
        first.set(f"{number:032x}", b"x")
    first.close()
    second = DiskStore(tmp_path, max_bytes=EVICT_BATCH * 4096 // 2)
    second.start()
    second.set(KEY_A, b"x")  # only keeps the folder from growing; the housekeeper evicts the rest, in turns
    _wait_until(lambda: second.used_bytes <= second.max_bytes)
    assert second.used_bytes <= second.max_bytes
    assert len(list(tmp_path.rglob("*.page"))) == len(second) == EVICT_BATCH // 2
    assert second.get(KEY_A) == b"x"  # the last page written stays


def test_disk_store_lowered_cap_is_evicted_in_short_turns_that_let_writes_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cold disk a deletion costs milliseconds: 256 of them in one transaction held every fill's write and
    `stats` for over a second. The housekeeper holds the index for EVICT_TURN_S at a time."""
    first = DiskStore(tmp_path, max_bytes=10**9)
    first.start()
    first.set_many([(f"{number:032x}", b"x") for number in range(300)])
    first.close()
    unlinked: list[str] = []
    real_unlink = os.unlink

    def cold_unlink(path: str) -> None:
        time.sleep(0.005)
        unlinked.append(path)
        real_unlink(path)

    second = DiskStore(tmp_path, max_bytes=100 * 4096)
    per_transaction: list[int] = []
    writing = second.index.writing

    @contextlib.contextmanager
    def counted() -> Iterator[IndexWrite]:
        before = len(unlinked)
        with writing() as write:
            yield write
        per_transaction.append(len(unlinked) - before)

    monkeypatch.setattr(second.index, "writing", counted)
    monkeypatch.setattr(os, "unlink", cold_unlink)
    second.start()
    second.set(KEY_A, b"x")  # a fill's write meanwhile keeps the folder from growing, and waits one turn at most
    _wait_until(lambda: second.used_bytes <= second.max_bytes)
    second.close()
    assert len(list(tmp_path.rglob("*.page"))) == 100 and second.get(KEY_A) == b"x"
    # 20 ms turns of 5 ms deletions: a handful each, where a transaction took 256.
    assert sum(per_transaction) >= 201 and max(per_transaction) <= 8, per_transaction


def test_disk_store_never_lists_the_folder_once_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pages = 50_000
    for number in range(pages):  # an older version's folder: 50,000 pages, no index
        key = f"{number:032x}"[::-1]
        folder = tmp_path / key[:2]
        if number < 256:
            folder.mkdir()
        (folder / f"{key}.page").write_bytes(b"p")
    monkeypatch.setattr(disk, "TOUCH_FLUSH_S", 0.02)
    monkeypatch.setattr(disk, "LOAD_PAUSE_S", 0.02)  # a slow loader, to start a second worker beside it
    loader = DiskStore(tmp_path, max_bytes=10**10)
    loader.start()
    _wait_until(lambda: loader.loading() is not None, poll_s=0.001)
    beside = DiskStore(tmp_path, max_bytes=10**10)
    beside.start()
    assert loader.loading() is not None and beside.loading() is not None
    assert beside.get(f"{pages - 1:032x}"[::-1]) == b"p"  # a hit at once, while the folder is loading
    assert loader.wait_loaded(60) and beside.wait_loaded(10)
    assert len(beside) == pages and beside.used_bytes == pages * 4096
    listed: list[str] = []
    real_scandir = os.scandir

    def counting_scandir(path: str | Path = ".") -> object:
        if str(path).startswith(str(tmp_path)):
            listed.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", counting_scandir)
    monkeypatch.setattr(os, "listdir", counting_scandir)
    for store in (loader, beside):
        store.get(f"{7:032x}"[::-1])
        store.set(KEY_A, b"new")
    time.sleep(20 * disk.TOUCH_FLUSH_S)  # twenty turns of each housekeeper
    assert listed == []


def test_disk_store_full_disk_evicts_and_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    store = DiskStore(tmp_path, max_bytes=100 * 4096)
    store.start()
    for number in range(20):
        store.set(f"{number:032x}", b"x" * 100)
    real_replace = os.replace
    failures = [OSError(errno.ENOSPC, "No space left on device")]

    def full_once(source: str, target: str) -> None:
        if failures:
            raise failures.pop()
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", full_once)
    store.set(KEY_A, b"new page")  # the disk is full once: room is made, the page is written
    assert store.get(KEY_A) == b"new page"
    assert len(store) < 21 and store.get("0" * 32) is None  # the least recently served went first


def test_disk_store_failed_index_commit_leaves_no_file_without_its_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DiskStore(tmp_path, max_bytes=10**6)
    store.start()

    def full(*args: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    with monkeypatch.context() as patched:
        patched.setattr(IndexWrite, "put", full)
        with pytest.raises(StoreUnavailable, match="disk is full"):
            store.set(KEY_A, b"page")
    assert not store.has_file(KEY_A) and list(tmp_path.rglob("*.page")) == []  # nobody would count it
    store.set(KEY_A, b"page")  # the disk has room again
    assert store.get(KEY_A) == b"page" and len(store) == 1


def test_disk_store_index_damaged_while_serving_is_rebuilt_and_every_process_moves_to_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk, "TOUCH_FLUSH_S", 0.05)
    serving = DiskStore(tmp_path, max_bytes=10**6)
    serving.start()
    assert serving.wait_loaded(10)
    for key in (KEY_A, KEY_B):
        serving.set(key, b"page")
    with contextlib.closing(sqlite3.connect(tmp_path / INDEX_FILE)) as checkpoint:
        checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the file, none in the log
    (tmp_path / INDEX_FILE).write_bytes(b"\0garbage, as a power cut may leave it" * 300)
    starting = DiskStore(tmp_path, max_bytes=10**6)
    starting.start()  # finds the damage: the file is moved aside, a new one begun
    serving.set(KEY_C, b"page")  # the serving process writes to the new file, not the damaged one
    _wait_until(lambda: sorted(starting.digests()) == [KEY_A, KEY_B, KEY_C])  # a housekeeper loads the folder
    assert sorted(serving.digests()) == sorted(starting.digests()) == [KEY_A, KEY_B, KEY_C]
    assert serving.used_bytes == 3 * 4096 and len(list(tmp_path.glob(f"{INDEX_FILE}.damaged-*[0-9]"))) == 1


def test_disk_store_processes_opening_a_damaged_index_at_once_share_the_new_one(tmp_path: Path) -> None:
    first = DiskStore(tmp_path, max_bytes=10**6)
    first.start()
    first.set(KEY_A, b"page")
    first.close()
    (tmp_path / INDEX_FILE).write_bytes(b"not a database" * 300)
    workers = [DiskStore(tmp_path, max_bytes=10**6) for _ in range(4)]
    threads = [threading.Thread(target=worker.start) for worker in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    workers[0].set(KEY_B, b"page")
    assert all(KEY_B in worker.digests() for worker in workers)  # one file, one count
    assert len(list(tmp_path.glob(f"{INDEX_FILE}.damaged-*[0-9]"))) == 1


def test_disk_store_in_a_forked_child_reads_writes_and_records_hits(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, max_bytes=10**6)
    store.start()
    store.set(KEY_A, b"page")
    child = os.fork()
    if child == 0:  # a pre-forking server's worker, forked after the gate started
        try:
            store.set(KEY_B, b"child's page")
            ok = store.get(KEY_A) == b"page" and store._housekeeper is not None
            store.close()
            os._exit(0 if ok else 1)
        finally:
            os._exit(2)
    assert exit_code_of(child) == 0
    assert store.get(KEY_B) == b"child's page" and KEY_B in store.digests()


def test_disk_store_forked_during_another_threads_transaction_writes_in_the_child(tmp_path: Path) -> None:
    """SQLite keeps a process's file locks in its own memory: a child forked in the middle of a parent thread's
    index transaction inherited them held, and its own writes waited for ever. Fork waits for the transaction."""
    store = DiskStore(tmp_path, max_bytes=10**6)
    store.start()
    store.set(KEY_A, b"page")
    inside, release = threading.Event(), threading.Event()

    def long_transaction() -> None:
        with store.index.writing():
            inside.set()
            release.wait(5)

    holder = threading.Thread(target=long_transaction)
    holder.start()
    assert inside.wait(5)
    threading.Timer(0.2, release.set).start()  # the fork below waits for this transaction to end
    child = os.fork()
    if child == 0:
        try:
            store.set(KEY_B, b"child's page")
            os._exit(0 if store.get(KEY_A) == b"page" else 1)
        finally:
            os._exit(2)
    holder.join()
    assert exit_code_of(child) == 0
    assert store.get(KEY_B) == b"child's page"
    store.close()


def test_disk_store_stopped_while_loading_does_not_say_loading_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk, "LOAD_PAUSE_S", 0.05)
    short_lived = DiskStore(tmp_path, max_bytes=10**6)
    short_lived.start()
    _wait_until(lambda: short_lived.loading() is not None, poll_s=0.001)
    short_lived.close()  # a command that ran a moment (a pre-flight check)
    assert DiskStore(tmp_path, max_bytes=10**6).loading() is None


def _wait_until(condition: Callable[[], bool], *, seconds: float = 10, poll_s: float = 0.05) -> None:
    """Poll ``condition`` until it holds, for ``seconds`` at most (what it waits for happens in a thread)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(poll_s)


def test_disk_store_eviction_cut_short_by_a_failure_leaves_no_row_without_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk makes a write evict in its own transaction; when a published copy cannot be removed
    midway (EACCES), the pages already deleted lose their rows too, and the write goes on failing alone."""
    moments = iter(range(1000, 2000))
    store = DiskStore(tmp_path, max_bytes=1 << 30, clock=lambda: float(next(moments)))
    store.index.open()
    keys = [f"{number:02x}" + "0" * 30 for number in range(1, 6)]
    for key in keys:
        store.set_many([(key, b"x" * 100)])

    def on_delete(key: str) -> int:
        if key == keys[1]:
            raise PermissionError(errno.EACCES, "Permission denied")
        return 0

    store.on_delete = on_delete
    replace = os.replace
    renames: list[str] = []

    def full_once(source: str, target: str) -> None:  # a full disk cannot be made here: the first rename finds one
        renames.append(target)
        if len(renames) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(disk.os, "replace", full_once)
    assert store.set_many([("ff" + "0" * 30, b"y" * 100)]) == []
    monkeypatch.setattr(disk.os, "replace", replace)
    rows = set(store.index.keys())
    assert {key for key in keys if store.has_file(key)} == rows == set(keys[2:])
    assert store.index.totals()[:2] == (3, 3 * 4096)
    store.close()


@contextlib.contextmanager
def _small_disk(folder: Path, options: str) -> Iterator[Path]:
    """A tmpfs of ``options`` mounted at ``folder`` for the test (a real full disk); CI runs as root and mounts it."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"a tmpfs cannot be mounted: {mounted.stderr.decode().strip()}")
        pytest.skip("a tmpfs cannot be mounted here (not root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_disk_store_starts_on_a_full_disk_by_removing_the_oldest_pages(tmp_path: Path) -> None:
    """Something else filled the disk while the gate was down: its index cannot open, and a gate that does not
    start leaves people without the site. The oldest pages make room; the newest stay."""
    with _small_disk(tmp_path / "small", "size=4m") as small:
        store = DiskStore(small / "l2", max_bytes=10**9)
        store.start()
        pages = {f"{number:02x}" + "0" * 30: os.urandom(40_000) for number in range(40)}
        for key, data in pages.items():
            store.set(key, data)
            time.sleep(0.002)  # one after the other, by their files' times
        store.close()
        with open(small / "other-data", "wb") as other, contextlib.suppress(OSError):
            while True:
                other.write(b"\0" * 65536)
                other.flush()
        restarted = DiskStore(small / "l2", max_bytes=10**9)
        restarted.start()  # "disk I/O error" opening the index, before
        try:
            kept = [key for key in pages if restarted.get(key) == pages[key]]
            assert 0 < len(kept) < len(pages) and kept == list(pages)[-len(kept) :]
        finally:
            restarted.close()


def test_disk_store_starts_on_a_disk_out_of_inodes(tmp_path: Path) -> None:
    """Out of inodes with bytes free is a full disk too: the oldest pages make room for the index."""
    with _small_disk(tmp_path / "small", "size=8m,nr_inodes=300") as small:
        store = DiskStore(small / "l2", max_bytes=10**9)
        store.start()
        for number in range(150):
            store.set(f"{number:032x}", os.urandom(2000))
        store.close()
        others = small / "other"
        others.mkdir()
        with contextlib.suppress(OSError):
            for number in range(1000):
                (others / str(number)).touch()
        restarted = DiskStore(small / "l2", max_bytes=10**9)
        restarted.start()  # "No space left on device" before, with megabytes free
        restarted.close()
        assert 0 < len(list((small / "l2").glob("??/*.page"))) < 150


def test_disk_store_warns_of_failed_writes_once_a_minute(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A disk that cannot take pages fails every fill: one line a minute says how many, not one line a fill."""
    store = DiskStore(tmp_path / "l2", max_bytes=10**8)
    store.start()
    try:
        (tmp_path / "l2" / "ab").write_text("a file where the shard folder should be")
        with caplog.at_level("WARNING", logger="crawlergate.stores.disk"):
            for number in range(50):
                store.set_many([(f"ab{number:030x}", b"page")])
        warnings = [record.getMessage() for record in caplog.records if "L2 write failed" in record.getMessage()]
        assert len(warnings) == 1 and "for 1 page(s)" in warnings[0]
    finally:
        store.close()
