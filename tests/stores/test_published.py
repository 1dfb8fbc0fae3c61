"""Pages published for nginx to serve directly: written only with their L2 copy and safely, unpublished before they
expire, and the direct log nginx writes counted across rotations."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from crawlergate.classify import Classifier
from crawlergate.config import Settings
from crawlergate.front.directlog import DirectLog
from crawlergate.keys import CacheKey, digest_of
from crawlergate.metrics import Metrics
from crawlergate.page import Page
from crawlergate.stores.disk import DiskStore
from crawlergate.stores.published import PublishedTree, drop_published


def _key(target: str) -> CacheKey:
    return CacheKey(target, digest_of(target))


def _page(body: bytes = b"<html>page</html>", **changes: object) -> Page:
    fields = dict(content_type="text/html; charset=utf-8", generated_at=time.time(), ttl_seconds=3600.0)
    fields.update(changes)
    return Page.from_response(200, body, **fields)  # type: ignore[arg-type]


def _stored(tmp_path: Path, max_bytes: int = 1 << 20) -> tuple[DiskStore, PublishedTree]:
    store = DiskStore(tmp_path / "l2", max_bytes=max_bytes)
    store.start()
    tree = PublishedTree(store, host="forum.example")
    tree.root.mkdir(parents=True)
    return store, tree


def _publish(store: DiskStore, tree: PublishedTree, target: str, page: Page | None = None) -> bool:
    page = page or _page()
    store.set(_key(target).digest, page.to_bytes())
    return tree.publish(_key(target), page)


def test_published_pages_are_counted_and_leave_with_their_l2_copy(tmp_path: Path) -> None:
    store, tree = _stored(tmp_path)
    assert _publish(store, tree, "/topic/1")
    assert (tree.root / "topic" / "1.gz").read_bytes() == _page().body_gz
    assert store.used_bytes == 2 * 4096  # the page and its published copy
    store.delete(_key("/topic/1").digest)
    assert not (tree.root / "topic" / "1.gz").exists() and store.used_bytes == 0


def test_a_page_without_its_l2_copy_or_one_nginx_cannot_give_is_not_published(tmp_path: Path) -> None:
    store, tree = _stored(tmp_path)
    assert not tree.publish(_key("/gone"), _page())
    assert not _publish(store, tree, "/feed", _page(content_type="application/rss+xml"))
    assert not _publish(store, tree, "/tagged", _page(headers=(("x-robots-tag", "noindex"),)))
    assert not _publish(store, tree, "/soon", _page(ttl_seconds=1.0))
    assert not _publish(store, tree, "/t?x=1")
    assert list(tree.root.rglob("*.gz")) == []


def test_a_planted_link_in_the_tree_is_never_written_through(tmp_path: Path) -> None:
    store, tree = _stored(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree.root / "topic").symlink_to(outside)
    assert not _publish(store, tree, "/topic/1")
    assert list(outside.iterdir()) == []


def test_the_start_check_drops_marked_expired_and_orphaned_pages(tmp_path: Path) -> None:
    store, tree = _stored(tmp_path)
    for target in ("/kept", "/marked", "/orphan-link"):
        assert _publish(store, tree, target)
    (tree.root / "stray.gz").write_bytes(b"no link")  # a file no link names
    os.unlink(store.path_for(_key("/orphan-link").digest))  # its L2 copy gone behind the gate's back
    tree.check({_key("/marked").digest})
    assert sorted(path.name for path in tree.root.rglob("*.gz")) == ["kept.gz"]


def test_the_sweeper_unpublishes_before_expiry(tmp_path: Path) -> None:
    store, tree = _stored(tmp_path)
    now = [time.time()]
    tree.clock = lambda: now[0]
    assert _publish(store, tree, "/short", _page(ttl_seconds=10.0))
    tree.sweep()
    assert (tree.root / "short.gz").exists()
    now[0] += 8.5
    tree.sweep()
    assert not (tree.root / "short.gz").exists()


def test_the_direct_log_is_counted_and_followed_across_a_rotation(tmp_path: Path) -> None:
    metrics = Metrics()
    log = tmp_path / "direct.log"
    reader = DirectLog(log, Classifier.from_settings(Settings().classify), metrics, lock=tmp_path / "lock")
    line = {"status": 200, "request_time": 0.001, "user_agent": "Mozilla/5.0 (compatible; Googlebot/2.1)"}
    log.write_text(json.dumps(line) + "\n")
    assert reader.read(from_end=True) == 0  # what was there before the gate started is not counted
    with log.open("a") as handle:
        handle.write(json.dumps(line) + "\nnot json\n" + json.dumps({**line, "status": 404}) + "\n")
        handle.write(json.dumps(line)[:10])  # half a line: counted once it is whole
    assert reader.read() == 1
    log.rename(tmp_path / "direct.log.1")
    log.write_text(json.dumps(line) + "\n" + json.dumps(line) + "\n")
    assert reader.read() == 2
    stats = metrics.snapshot()
    assert stats["crawler"]["direct_hits"] == 3 and stats["families"]["Googlebot"]["outcomes"]["direct"] == 3
    reader.close()


def test_deep_or_long_paths_and_gz_names_stay_with_the_gate(tmp_path: Path) -> None:
    store, tree = _stored(tmp_path)
    assert not _publish(store, tree, "/a" * 17)
    assert not _publish(store, tree, "/" + "/".join(["x" * 200] * 6))
    assert not _publish(store, tree, "/topic/1.gz")
    assert _publish(store, tree, "/a" * 16)
    assert list(tree.root.iterdir()) == [tree.root / "a"]


def test_removing_a_page_removes_the_folders_it_leaves_empty(tmp_path: Path) -> None:
    store, tree = _stored(tmp_path)
    assert _publish(store, tree, "/forum/7/page/2")
    assert _publish(store, tree, "/forum/8")
    store.delete(_key("/forum/7/page/2").digest)
    assert not (tree.root / "forum" / "7").exists() and (tree.root / "forum" / "8.gz").exists()


def test_the_tree_is_readable_by_nginx_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o027)  # systemd's UMask in deploy/systemd/crawlergate.service
    try:
        store, tree = _stored(tmp_path)
        assert _publish(store, tree, "/forum/7")
    finally:
        os.umask(previous)
    assert (tree.root / "forum").stat().st_mode & 0o777 == 0o755
    assert (tree.root / "forum" / "7.gz").stat().st_mode & 0o777 == 0o644


def test_a_changed_page_of_the_same_size_and_date_gets_a_new_validator(tmp_path: Path) -> None:
    store, tree = _stored(tmp_path)
    dated = {"last_modified": 1_700_000_000.0}
    assert _publish(store, tree, "/t", _page(b"<html>replies: 0</html>", **dated))
    first = os.stat(tree.root / "t.gz")
    assert _publish(store, tree, "/t", _page(b"<html>replies: 8</html>", **dated))
    second = os.stat(tree.root / "t.gz")
    assert second.st_size == first.st_size and int(second.st_mtime) == int(first.st_mtime) + 1
    assert _publish(store, tree, "/t", _page(b"<html>replies: 8</html>", **dated))  # the same bytes: no change
    assert int(os.stat(tree.root / "t.gz").st_mtime) == int(second.st_mtime)


def test_a_tree_left_from_a_run_with_publishing_is_dropped(tmp_path: Path) -> None:
    store, tree = _stored(tmp_path)
    assert _publish(store, tree, "/forum/7")
    drop_published(store.root)
    assert not (store.root / "published").exists() and list(store.root.glob("??/*.pub")) == []
    assert store.get(_key("/forum/7").digest) is not None  # the page itself stays in L2


def test_the_direct_log_counts_what_was_written_before_the_rotation_and_odd_bytes(tmp_path: Path) -> None:
    metrics = Metrics()
    log = tmp_path / "direct.log"
    log.write_bytes(b"")
    reader = DirectLog(log, Classifier.from_settings(Settings().classify), metrics, lock=tmp_path / "lock")
    reader.read(from_end=True)
    line = b'{"status":200,"request_time":0.001,"user_agent":"Googlebot/2.1 \xff"}\n'
    with log.open("ab") as handle:
        handle.write(line)
        log.rename(tmp_path / "direct.log.1")
        handle.write(line)  # nginx writes to the renamed file until it reopens
    log.write_bytes(line)
    assert reader.read() == 3
    reader.close()


def test_a_copy_published_again_after_a_mark_never_repeats_an_old_validator(tmp_path: Path) -> None:
    store, tree = _stored(tmp_path)
    dated = {"last_modified": 1_700_000_000.0}
    assert _publish(store, tree, "/t", _page(b"<html>replies: 0</html>", **dated))
    tree.unpublish([_key("/t").digest])  # a mark: the file goes, its validators stay in the link
    assert not (tree.root / "t.gz").exists()
    assert _publish(store, tree, "/t", _page(b"<html>replies: 8</html>", **dated))
    assert int(os.stat(tree.root / "t.gz").st_mtime) == 1_700_000_001


def test_the_direct_log_reads_the_rotated_file_until_nginx_reopens(tmp_path: Path) -> None:
    metrics = Metrics()
    log = tmp_path / "direct.log"
    log.write_bytes(b"")
    reader = DirectLog(log, Classifier.from_settings(Settings().classify), metrics, lock=tmp_path / "lock")
    reader.read(from_end=True)
    line = b'{"status":200,"request_time":0.001,"user_agent":"Googlebot/2.1"}\n'
    with log.open("ab") as nginx:
        log.rename(tmp_path / "direct.log.1")
        log.write_bytes(b"")  # logrotate's "create": the new file is there before nginx reopens
        assert reader.read() == 0
        nginx.write(line * 2)  # nginx still writes to the old one
    assert reader.read() == 2
    reader.close()
