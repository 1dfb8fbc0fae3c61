from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from crawlergate.keys import digest_of
from crawlergate.stores.disk import DiskStore
from crawlergate.stores.presence import PRESENCE_FILE, PresenceFilter

# Page keys as the gate names them: digests (crawlergate/keys.py).
KEYS = [digest_of(f"/showthread.php?t={number}") for number in range(200)]


def _loaded(path: Path, present: list[str]) -> PresenceFilter:
    presence = PresenceFilter(path, slots=1 << 16)
    presence.open()
    presence.renew()
    presence.add(present)
    presence.complete()
    return presence


def test_presence_filter_says_maybe_until_a_listing_completed_it(tmp_path: Path) -> None:
    presence = PresenceFilter(tmp_path / PRESENCE_FILE, slots=1 << 16)
    presence.open()
    assert all(presence.may_have(key) for key in KEYS)  # new: nothing is known absent yet
    presence.renew()
    presence.add(KEYS[:50])
    assert presence.may_have(KEYS[100])  # listed in part
    presence.complete()
    assert all(presence.may_have(key) for key in KEYS[:50])
    assert sum(presence.may_have(key) for key in KEYS[50:]) <= 2  # surely absent, but for a rare false "maybe"


def test_presence_filter_a_renewal_by_another_process_reaches_every_process(tmp_path: Path) -> None:
    path = tmp_path / PRESENCE_FILE
    writer = _loaded(path, KEYS[:10])
    loader = _loaded(path, KEYS[:10])  # another process's loader renews it
    assert loader.may_have(KEYS[0])
    marked = writer.add([KEYS[20]])  # a write under way in the first process, marked in the old filter
    writer.confirm([KEYS[20]], marked)  # its file appeared: the renewed filter gets the mark too
    assert loader.may_have(KEYS[20]) and writer.may_have(KEYS[20]) and not writer.may_have(KEYS[30])


def test_presence_filter_a_renewal_in_the_same_process_keeps_a_write_under_way(tmp_path: Path) -> None:
    presence = _loaded(tmp_path / PRESENCE_FILE, [])
    marked = presence.add([KEYS[5]])
    presence.renew()  # the loader, in a thread, between the mark and the rename
    presence.confirm([KEYS[5]], marked)
    presence.complete()
    assert presence.may_have(KEYS[5])


def test_presence_filter_damaged_file_is_replaced_and_says_maybe(tmp_path: Path) -> None:
    path = tmp_path / PRESENCE_FILE
    path.write_bytes(b"not a filter")
    presence = PresenceFilter(path, slots=1 << 16)
    presence.open()
    assert presence.may_have(KEYS[0]) and path.stat().st_size > 1 << 16


def _write_page(folder: str, key: str) -> None:
    store = DiskStore(Path(folder), max_bytes=10**8)
    store.start()
    store.set(key, b"another worker's page")
    store.close()


def test_disk_store_knows_pages_other_processes_wrote_once_loaded(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, max_bytes=10**8)
    store.start()
    store.set(KEYS[0], b"page")
    assert store.wait_loaded(10)
    assert store.may_have(KEYS[0]) and not store.may_have(KEYS[1])
    worker = multiprocessing.get_context("spawn").Process(target=_write_page, args=(str(tmp_path), KEYS[1]))
    worker.start()
    worker.join(30)
    assert worker.exitcode == 0
    # The other process's loader renewed the filter and listed the folder; this one maps the new filter.
    assert store.may_have(KEYS[1]) and store.get(KEYS[1]) == b"another worker's page"
    assert store.may_have(KEYS[0])
    store.close()
    assert os.path.exists(tmp_path / PRESENCE_FILE)
