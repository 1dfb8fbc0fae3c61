from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from crawlergate.errors import ConfigError, StoreUnavailable
from crawlergate.stores import disk
from crawlergate.stores.disk import EVICT_BATCH, INDEX_FILE, DiskStore

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
    second.set(KEY_A, b"x")  # evicts one batch; the housekeeper the rest, a batch a transaction
    deadline = time.monotonic() + 10
    while second.used_bytes > second.max_bytes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert second.used_bytes <= second.max_bytes
    assert len(list(tmp_path.rglob("*.page"))) == len(second) == EVICT_BATCH // 2
    assert second.get(KEY_A) == b"x"  # the last page written stays


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
    while loader.loading() is None:
        time.sleep(0.001)
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
