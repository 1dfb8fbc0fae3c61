"""The prefetcher: people's views queued on the request path, worked through by a thread of its own in batches."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from crawlergate.gate import prefetcher
from crawlergate.gate.prefetcher import Prefetcher
from crawlergate.keys import CacheKey
from tests.conftest import exit_code_of


def _key(number: int) -> CacheKey:
    return CacheKey(f"/t/{number}", f"{number:032x}")


def _wait_until(condition: Callable[[], bool], seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_prefetcher_works_through_views_in_its_own_thread() -> None:
    done: list[tuple[str, str]] = []
    queue = Prefetcher(lambda key: done.append((key.target, threading.current_thread().name)))
    for number in range(5):
        queue.offer(_key(number))
    assert _wait_until(lambda: len(done) == 5)
    assert [target for target, _ in done] == [f"/t/{number}" for number in range(5)]
    assert {thread for _, thread in done} == {"crawlergate-prefetch"}
    queue.close()


def test_prefetcher_goes_on_after_a_prefetch_fails() -> None:
    done: list[str] = []

    def prefetch(key: CacheKey) -> None:
        if key.target == "/t/1":
            raise RuntimeError("a store broke")
        done.append(key.target)

    queue = Prefetcher(prefetch)
    for number in range(3):
        queue.offer(_key(number))
    queue.drain()
    assert done == ["/t/0", "/t/2"]
    queue.offer(_key(3))
    assert _wait_until(lambda: done == ["/t/0", "/t/2", "/t/3"])
    queue.close()


def test_prefetcher_drops_views_past_its_queue_and_close_finishes_the_rest(monkeypatch: object) -> None:
    monkeypatch.setattr(prefetcher, "MAX_QUEUED", 3)  # type: ignore[attr-defined]
    release = threading.Event()
    done: list[str] = []

    def prefetch(key: CacheKey) -> None:
        release.wait(10)  # the thread is busy: the queue fills
        done.append(key.target)

    queue = Prefetcher(prefetch)
    queue.offer(_key(0))
    assert _wait_until(lambda: done == [] and not queue._keys)  # the thread holds the first view
    for number in range(1, 6):
        queue.offer(_key(number))
    assert queue.dropped == 2
    release.set()
    queue.close()
    assert done == ["/t/0", "/t/1", "/t/2", "/t/3"]


def test_prefetcher_in_a_forked_child_starts_its_own_thread() -> None:
    done: list[str] = []
    queue = Prefetcher(lambda key: done.append(key.target))
    queue.offer(_key(0))
    assert _wait_until(lambda: done == ["/t/0"])
    child = os.fork()
    if child == 0:  # the parent's thread is not here: the child's views must still be worked through
        queue.offer(_key(1))
        os._exit(0 if _wait_until(lambda: done == ["/t/0", "/t/1"], seconds=5) else 1)
    assert exit_code_of(child) == 0
    queue.close()
