from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from crawlergate.errors import ConfigError, StoreUnavailable
from crawlergate.stores.disk import DiskStore

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
    leftover = first.path_for(KEY_A).with_name(".tmp-crashed")
    leftover.write_bytes(b"half a page")
    os.utime(leftover, (time.time() - 120, time.time() - 120))  # a crash's, two minutes ago
    under_way = first.path_for(KEY_A).with_name(".tmp-another-worker")
    under_way.write_bytes(b"being written")
    second = DiskStore(tmp_path, max_bytes=10_000)
    second.start()
    assert len(second) == 1 and second.used_bytes == 4096
    assert not leftover.exists()
    assert under_way.exists()  # a worker starting beside another never takes its write away


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
    assert store.get(KEY_A) == b"old layout" and not old.exists()


def test_disk_store_cap_holds_for_processes_sharing_the_folder(tmp_path: Path) -> None:
    clock = [0.0]
    workers = [DiskStore(tmp_path, max_bytes=10 * 4096, clock=lambda: clock[0]) for _ in range(2)]
    for worker in workers:
        worker.start()
    for number in range(16):  # 16 pages of one block, written by two "processes" in turn
        workers[number % 2].set(f"{number:032x}", b"x" * 100)
    clock[0] += 31  # past the rescan interval: the next write recounts the folder
    workers[0].set("f" * 32, b"x" * 100)
    workers[1].set("e" * 32, b"x" * 100)
    on_disk = sum(4096 for _ in tmp_path.rglob("*.page"))
    assert on_disk <= 10 * 4096


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
