from __future__ import annotations

import os
import threading
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
    assert store.path_for(KEY_A) == tmp_path / "aa" / "aa" / f"{KEY_A}.page"
    store.delete(KEY_A)
    assert store.get(KEY_A) is None
    assert store.used_bytes == 0


def test_disk_store_evicts_least_recently_served(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, max_bytes=250)
    store.start()
    store.set(KEY_A, b"x" * 100)
    store.set(KEY_B, b"x" * 100)
    store.get(KEY_A)
    store.set(KEY_C, b"x" * 100)
    assert store.get(KEY_B) is None
    assert store.get(KEY_A) is not None and store.get(KEY_C) is not None
    assert store.used_bytes == 200


def test_disk_store_start_indexes_existing_pages_and_drops_temp_files(tmp_path: Path) -> None:
    first = DiskStore(tmp_path, max_bytes=10_000)
    first.start()
    first.set(KEY_A, b"x" * 10)
    leftover = first.path_for(KEY_A).with_name(".tmp-crashed")
    leftover.write_bytes(b"half a page")
    second = DiskStore(tmp_path, max_bytes=10_000)
    second.start()
    assert len(second) == 1 and second.used_bytes == 10
    assert not leftover.exists()


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
