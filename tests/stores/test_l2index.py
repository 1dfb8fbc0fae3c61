"""The L2 index's reads and writes of many pages: as many SQLite steps for 2,000 pages as for 3.

SQLite lets the GIL go around each step (a run of a statement, or a row read back); beside a busy event loop a
thread then waits for it again at every step: 8,000 hits' recency took 35 s that way, one statement 56 ms. So the
steps a bulk operation takes must not grow with its rows: counted here, not timed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from crawlergate.errors import ConfigError, StoreUnavailable
from crawlergate.gate.catalogue import PageCatalogue
from crawlergate.stores.l2index import IndexWrite, L2Index
from tests.conftest import CountedSteps


def steps_of(index: L2Index, work: Callable[[IndexWrite], object]) -> int:
    """The SQLite steps ``work`` takes inside one write transaction of ``index``."""
    with index.writing() as write:
        counted = CountedSteps(write._database)
        write._database = counted  # type: ignore[assignment]
        work(write)
    return counted.steps


def key(number: int) -> str:
    return f"{number:032x}"


def bulk_steps(folder: Path, pages: int) -> list[int]:
    """The steps of each bulk operation on ``pages`` pages: added, marked used, the oldest read, a shard's keys
    read, all but one removed."""
    index = L2Index(folder / f"l2-{pages}.sqlite3")
    index.open()
    keys = [key(number) for number in range(pages)]
    steps = [
        steps_of(index, lambda write: write.put_many([(k, 4096, 100.0) for k in keys])),
        steps_of(index, lambda write: write.mark_used({k: 200.0 + n for n, k in enumerate(keys)})),
        steps_of(index, lambda write: write.least_recently_used(pages)),
        steps_of(index, lambda write: write.keys_from("00")),
        steps_of(index, lambda write: write.remove_many(keys[1:])),
    ]
    assert index.totals()[:2] == (1, 4096)
    index.close()
    return steps


def test_l2_index_bulk_operations_take_as_many_steps_for_2000_pages_as_for_3(tmp_path: Path) -> None:
    assert bulk_steps(tmp_path, 2000) == bulk_steps(tmp_path, 3) == [1, 1, 1, 1, 1]


def test_l2_index_bulk_operations_keep_their_meaning(tmp_path: Path) -> None:
    index = L2Index(tmp_path / "l2.sqlite3")
    index.open()
    keys = [key(number) for number in range(300)]
    with index.writing() as write:
        write.put_many([(k, 4096 * (1 + n % 3), 100.0) for n, k in enumerate(keys)])
        write.put_many([(keys[0], 1, 0.0)])  # a page already held keeps its row
        write.mark_used({k: 1000.0 - n for n, k in enumerate(keys)})  # the last key used longest ago
        oldest = write.least_recently_used(3)
        in_shard = write.keys_from("00")
        write.remove_many([keys[-1], "not-held"])
    assert oldest == [(keys[-1], 4096 * (1 + 299 % 3)), (keys[-2], 4096 * (1 + 298 % 3)), (keys[-3], 4096)]
    assert in_shard == {k for k in keys if k.startswith("00")}
    assert index.totals()[0] == 299
    assert sorted(index.keys()) == keys[:-1]
    with index.writing() as write:
        assert write.least_recently_used(0) == []
        assert write.keys_from("ff") == set()
        write.mark_used({})
        write.put_many([])
        write.remove_many([])
    index.close()


def test_an_sqlite_too_old_for_bulk_statements_is_named_and_nothing_is_moved_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = L2Index(tmp_path / "l2.sqlite3")
    index.open()
    index.close()
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    with pytest.raises(StoreUnavailable, match=r"SQLite 3\.31\.1 is older than 3\.33, which crawlergate needs"):
        L2Index(tmp_path / "l2.sqlite3").open()
    with pytest.raises(ConfigError, match=r"page catalogue .* SQLite 3\.31\.1 is older than 3\.33"):
        PageCatalogue(tmp_path / "dirty.sqlite3").start()
    assert not [path for path in tmp_path.iterdir() if "damaged" in path.name]
