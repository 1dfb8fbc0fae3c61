"""The crawler flow on its own: no server, no interface. A runner of a dozen lines performs its steps with the
gate's real stores and filler, in front of a site function; what the flow asks for, step by step, is the
contract the ASGI and WSGI adapters drive (test_engine.py runs the same decisions through both)."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from crawlergate.cache import INLINE_L2_PAGE_BYTES, CacheHit
from crawlergate.config import CacheSettings, L2Settings, Settings
from crawlergate.errors import OriginError
from crawlergate.gate.fill import FillResult
from crawlergate.gate.flow import Answer, run_blocking
from crawlergate.gate.origin import OriginResponse
from crawlergate.gate.request import Request, Route
from crawlergate.keys import CacheKey
from crawlergate.wiring import GateRuntime
from tests.conftest import dropped_until_a_read_waits, reads_without_waiting
from tests.visitors import FIREFOX, GOOGLEBOT, raw_headers

GZIP = {"accept-encoding": "gzip, deflate, br"}
PAGE = b"<p>thread 1</p>" + b"post " * 300


@dataclass
class Site:
    """The origin: a function of the target; ``down`` makes every fetch fail."""

    fetched: list[str] = field(default_factory=list)
    bodies: dict[str, bytes] = field(default_factory=dict)
    down: bool = False

    def fetch(self, target: str) -> OriginResponse:
        self.fetched.append(target)
        if self.down:
            raise OriginError(f"{target}: refused")
        return OriginResponse(200, (("content-type", "text/html"),), self.bodies.get(target, PAGE))


class Runner:
    """Performs the flow's steps in the calling thread, and remembers which it was asked for."""

    def __init__(self, runtime: GateRuntime, site: Site) -> None:
        self.runtime, self.site = runtime, site
        self.cache = runtime.core.cache
        self.steps: list[str] = []
        self.background_work: list[Callable[[], object]] = []

    def lookup_l1(self, key: CacheKey) -> CacheHit | None:
        self.steps.append("Lookup")
        return self.runtime.core.cache.lookup_l1(key)

    async def lookup_l2(self, key: CacheKey) -> CacheHit | None:
        self.steps.append("L2")
        return self.runtime.core.cache.lookup_l2(key)

    async def fill(self, key: CacheKey, client: str | None, context: Any) -> FillResult:
        self.steps.append("Fill")
        return self.runtime.filler.fill_blocking(key, lambda: self.site.fetch(key.target))

    async def blocking(self, work: Callable[[], Any]) -> Any:
        self.steps.append("Blocking")
        return work()

    def background(self, work: Callable[[], object]) -> None:
        self.background_work.append(work)  # the catalogue's upkeep, when due: not part of the answer


class Clock:
    now = 2_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def gate(tmp_path: Path) -> Any:
    clock = Clock()
    settings = Settings(
        l2=L2Settings(cache_dir=str(tmp_path / "l2")),
        cache=CacheSettings(sites=("demo-forum",), ttl_seconds=3600, max_stale_seconds=600, fill_timeout_seconds=2),
    )
    site = Site()

    async def not_regenerated(key: CacheKey) -> OriginResponse:
        raise AssertionError("no regeneration in these tests")

    runtime = GateRuntime(settings, fetch_for_regeneration=not_regenerated, clock=clock)
    runtime.start()
    yield runtime, site, clock
    runtime.close()


def ask(runtime: GateRuntime, site: Site, target: str, headers: Mapping[str, str], method: str = "GET"):
    """One request through the flow: its route, the steps it asked for, and its answer (None: pass)."""
    path, _, query = target.partition("?")
    request = Request(method, path, path.encode(), query.encode(), raw_headers(headers), "203.0.113.9")
    decision = runtime.core.decide(request)
    runner = Runner(runtime, site)
    answer = run_blocking(runtime.flow.answer(request, decision), runner, None)
    if answer is not None:
        runtime.flow.finish(request, decision, answer, time.perf_counter())
    return decision.route, runner.steps, answer


def outcome(answer: Answer | None) -> str:
    assert answer is not None
    return dict(answer.response[1])[b"x-crawlergate"].decode()


def test_flow_crawler_miss_then_hit_and_head(gate: Any) -> None:
    runtime, site, _ = gate
    route, steps, miss = ask(runtime, site, "/showthread.php?t=1", GOOGLEBOT)
    assert route is Route.CACHE and steps == ["Lookup", "Fill"] and outcome(miss) == "miss"
    _, steps, hit = ask(runtime, site, "/showthread.php?t=1&utm_source=x", GOOGLEBOT)  # tracking dropped
    assert steps == ["Lookup"] and outcome(hit) == "l1-hit" and hit is not None and hit.response[2] == miss.response[2]
    _, _, head = ask(runtime, site, "/showthread.php?t=1", GOOGLEBOT, method="HEAD")
    assert head is not None and head.response[2] == b"" and site.fetched == ["/showthread.php?t=1"]
    stats = runtime.figures.stats()
    assert sum(stats[kind]["l1_hits"] for kind in ("crawler", "suspect")) == 2  # counted once sent, as a claimant


def test_flow_waits_for_an_l2_read_only_when_the_page_is_too_large_to_read_at_once(gate: Any) -> None:
    runtime, site, _ = gate
    _, steps, _ = ask(runtime, site, "/showthread.php?t=2", GOOGLEBOT)
    assert steps == ["Lookup", "Fill"]  # no file: the miss never waits for an L2 read (a thread, on an event loop)
    site.bodies["/showthread.php?t=3"] = base64.b64encode(os.urandom(INLINE_L2_PAGE_BYTES))  # gzip keeps 3/4
    ask(runtime, site, "/showthread.php?t=3", GOOGLEBOT)
    runtime.filler.writer.flush()
    cache = runtime.core.cache
    for query, read_in_a_thread in ((b"t=2", reads_without_waiting(cache.l2.root) is False), (b"t=3", True)):
        cache.l1.delete(runtime.core.keys.key_for(b"/showthread.php", query).digest)
        # As Googlebot asks (gzip): a large page is not decompressed in a thread for it.
        _, steps, hit = ask(runtime, site, f"/showthread.php?{query.decode()}", {**GOOGLEBOT, **GZIP})
        # In the system's memory and small: read at once, where the file system can say so; else in a thread.
        assert steps == (["Lookup", "L2"] if read_in_a_thread else ["Lookup"]) and outcome(hit) == "l2-hit"
    assert site.fetched == ["/showthread.php?t=2", "/showthread.php?t=3"]


def test_flow_waits_for_an_l2_read_when_the_disk_must_give_the_page(gate: Any) -> None:
    runtime, site, _ = gate
    ask(runtime, site, "/showthread.php?t=2", GOOGLEBOT)
    runtime.filler.writer.flush()
    cache, digest = runtime.core.cache, runtime.core.keys.key_for(b"/showthread.php", b"t=2").digest
    if not reads_without_waiting(cache.l2.root):
        pytest.skip("this file system cannot say whether a read would wait: every L2 read is a thread's")

    def read_waited() -> bool:
        cache.l1.delete(digest)
        _, steps, hit = ask(runtime, site, "/showthread.php?t=2", GOOGLEBOT)
        assert outcome(hit) == "l2-hit" and steps in (["Lookup"], ["Lookup", "L2"])
        return steps == ["Lookup", "L2"]  # on the disk only: read in a thread

    dropped_until_a_read_waits(cache.l2.path_for(digest), read_waited)


def test_flow_people_sessions_and_too_long_targets(gate: Any) -> None:
    runtime, site, _ = gate
    ask(runtime, site, "/showthread.php?t=2", GOOGLEBOT)
    assert ask(runtime, site, "/showthread.php?t=2", FIREFOX) == (Route.PASS, [], None)
    member = {**GOOGLEBOT, "cookie": "sessionid=4.abc"}
    assert ask(runtime, site, "/showthread.php?t=2", member) == (Route.PASS, [], None)
    route, steps, too_long = ask(runtime, site, "/showthread.php?t=" + "9" * 9000, GOOGLEBOT)
    assert route is Route.TOO_LONG and steps == [] and too_long is not None and too_long.response[0] == 414


def test_flow_stale_beats_down_and_a_failed_miss_is_an_error(gate: Any) -> None:
    runtime, site, clock = gate
    ask(runtime, site, "/showthread.php?t=3", GOOGLEBOT)
    site.down = True
    clock.now += 3600 + 601  # expired, and staler than max_stale: a fill is due
    _, steps, stale = ask(runtime, site, "/showthread.php?t=3", GOOGLEBOT)
    assert steps == ["Lookup", "Fill", "Blocking"] and outcome(stale) == "stale"  # the stale copy: read off the loop
    _, steps, missing = ask(runtime, site, "/showthread.php?t=4", GOOGLEBOT)
    # No stored copy to fall back on: the flow asks for the disk's stale copy before giving up.
    assert steps == ["Lookup", "Fill", "Blocking"] and missing is not None and missing.response[0] == 502


def test_flow_marked_pages_are_served_until_too_stale(gate: Any) -> None:
    runtime, site, clock = gate
    ask(runtime, site, "/showthread.php?t=5", GOOGLEBOT)
    assert runtime.invalidation.mark_changed("/showthread.php?t=5") == 1
    clock.now += 300
    assert outcome(ask(runtime, site, "/showthread.php?t=5", GOOGLEBOT)[2]) == "l1-hit"
    clock.now += 301
    assert outcome(ask(runtime, site, "/showthread.php?t=5", GOOGLEBOT)[2]) == "miss"


def test_flow_a_persons_view_of_a_stored_page_and_a_write_are_followed_up(gate: Any) -> None:
    runtime, site, _ = gate
    ask(runtime, site, "/showthread.php?t=8", GOOGLEBOT)
    runtime.filler.writer.flush()  # the filled page on disk
    runtime.core.cache.l1.delete(runtime.core.keys.key_for(b"/showthread.php", b"t=8").digest)
    view = Request("GET", "/showthread.php", b"/showthread.php", b"t=8", raw_headers(FIREFOX), "203.0.113.9")
    passing = runtime.flow.passing(view, runtime.core.decide(view), time.perf_counter())
    passing.answered(200, [(b"content-type", b"text/html")])
    passing.body(100)
    passing.finished()
    passing.left()
    assert passing.follow_up() is None  # the view is queued for the prefetcher, not run by the adapter
    runtime.flow.prefetcher.drain()
    digest = runtime.core.keys.key_for(b"/showthread.php", b"t=8").digest
    assert runtime.core.cache.l1.get(digest) is not None  # L2's copy is back in L1

    session = raw_headers({**FIREFOX, "cookie": "sessionid=4.abc"})
    reply = Request("POST", "/newreply.php", b"/newreply.php", b"", session, "203.0.113.9")
    passing = runtime.flow.passing(reply, runtime.core.decide(reply), time.perf_counter())
    assert passing.wants_form(lambda: b"application/x-www-form-urlencoded")
    passing.form = bytearray(b"t=8&message=hello")
    passing.answered(303, [(b"location", b"/showthread.php?t=8")])
    passing.left()
    mark = passing.follow_up()
    assert mark is not None and mark() >= 1 and runtime.figures.stats()["dirty"] == 1
