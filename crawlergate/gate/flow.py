"""The crawler flow: a request's way through the gate, as plain values, free of I/O.

h11's shape: the protocol decides, the caller does the I/O. For a crawler's cacheable page,
``CrawlerFlow.answer`` is a generator that walks L1 → L2 → the device copy → the demand note →
serve or fill → spare the site → fill → the answer. Wherever it needs the world it yields a step,
and the adapter sends back what the step gave:

- a ``CacheKey`` (a lookup): its stored copy, L1 then L2 (a ``CacheHit``, or None);
- ``Fill(key)``: a guest sub-request through the filler (a ``FillResult``);
- ``Blocking(work)``: work that may wait on the disk (a worker thread on an event loop, inline in a
  thread); its result;
- ``Background(work)``: work off the response path (the adapter schedules it and sends None at once).

The generator returns the ``Answer`` to send, or None: pass the request to the site. A request passed
to the site is watched by a ``Passing``, whose hooks the adapter calls as the site answers; it marks the
answer, samples the valve, counts, logs, and names the prefetch or the write rule's marks to run after.
The ASGI and WSGI middlewares (and through the first the proxy) differ only in how they run the steps.

    flow = CrawlerFlow(core, invalidation, access_log)
    answer = advance(flow.answer(request, decision), runner)   # an L1 hit: answered here
    if isinstance(answer, Waiting):
        answer = await run(answer, runner, scope)               # the steps that wait: L2, fills, the disk
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from crawlergate.cache import CacheHit, TwoLevelCache
from crawlergate.errors import OriginTimeout
from crawlergate.gate.accesslog import AccessLog
from crawlergate.gate.answer import (
    INLINE_PAGE_BYTES,
    LEFT_BEFORE_HEAD,
    SEND_PIECE_BYTES,
    Answered,
    Later,
    Response,
    accepts_gzip,
    page_response,
    plain_response,
)
from crawlergate.gate.engine import GateCore
from crawlergate.gate.fill import FillResult
from crawlergate.gate.invalidate import Invalidation
from crawlergate.gate.origin import OriginResponse, PassedOn
from crawlergate.gate.prefetcher import Prefetcher
from crawlergate.gate.request import Decision, Request, RequestHeaders, Route
from crawlergate.gate.writes import FORM_TYPES, form_fields
from crawlergate.keys import CacheKey
from crawlergate.page import Page

# Fills after which a stored copy of any age is better than what the site sent.
_FAILED_FILL = ("origin-error", "incomplete", "empty", "redirect-to-self")
# Answer headers that belong to the guest fill alone, never handed to a crawler.
_PER_RESPONSE_HEADERS = (
    "content-length",
    "transfer-encoding",
    "connection",
    "content-encoding",
    "set-cookie",
    "x-crawlergate",
)
# Stored pages whose gzip body is larger are decompressed in a thread for a client without gzip.
HEAVY_PAGE_BYTES = INLINE_PAGE_BYTES // 4
_HIT = {"l1": (b"l1-hit", "l1-hit"), "l2": (b"l2-hit", "l2-hit")}
# The mark of an answer the site gave (as ASGI and as WSGI headers).
PASS_HEADER = (b"x-crawlergate", b"pass")
PASS_HEADER_TEXT = ("X-Crawlergate", "pass")
_SET_COOKIE = (b"set-cookie", "set-cookie")
_LOCATION = (b"location", "location")


# A lookup step is the key itself: read its stored copy, L1 then L2; send back the CacheHit or None. The most
# frequent step allocates nothing.
Lookup = CacheKey


@dataclass(slots=True)
class Fill:
    """Fetch ``key`` from the site as a guest for the visitor at ``client``, through the filler; send back the
    FillResult."""

    key: CacheKey
    client: str | None


@dataclass(slots=True)
class Blocking:
    """Run ``work``, which may wait on the disk, off an event loop; send back what it returned."""

    work: Callable[[], Any]


@dataclass(slots=True)
class Background:
    """Run ``work`` off the response path; send back None at once."""

    work: Callable[[], object]


Step = Lookup | Fill | Blocking | Background


@dataclass(slots=True)
class Answer:
    """What the gate answers itself: the response, its outcome (as counted; empty: not counted) and the
    origin time a hit saved."""

    response: Response
    outcome: str
    saved_ms: float = 0.0


Steps = Generator[Step, Any, Answer | None]


class StepRunner(Protocol):
    """How an adapter performs the flow's steps (``context`` is its request: a scope, an environ)."""

    cache: TwoLevelCache

    def lookup_l1(self, key: CacheKey) -> CacheHit | None: ...

    async def lookup_l2(self, key: CacheKey) -> CacheHit | None: ...

    async def fill(self, key: CacheKey, client: str | None, context: Any) -> FillResult: ...

    async def blocking(self, work: Callable[[], Any]) -> Any: ...

    def background(self, work: Callable[[], object]) -> None: ...


@dataclass(slots=True)
class Prepared:
    """A request decided and advanced as far as it goes at once: an Answer, Waiting, or None (pass it on);
    ``started`` is its ``time.perf_counter()`` reading."""

    request: Request
    decision: Decision
    progress: Answer | Waiting | None
    started: float


@dataclass(slots=True)
class Waiting:
    """Steps stopped at ``step``, which must wait: a lookup whose L1 read missed, a fill, or disk work."""

    steps: Steps
    step: Step


def advance(steps: Steps | None, runner: StepRunner, reply: Any = None) -> Answer | Waiting | None:
    """Send ``reply`` on and perform the steps that never wait (an L1 read that hits, background work) until the
    flow answers (the Answer, or None: pass the request to the site) or a step must wait (``Waiting``: ``run``
    goes on). A crawler's L1 hit, the common request, is answered here without an await."""
    if steps is None:
        return None
    while True:
        try:
            step = steps.send(reply)
        except StopIteration as finished:
            answer: Answer | None = finished.value
            return answer
        if isinstance(step, Lookup):
            # L1 answers at once (the embedded store in microseconds, memcached within its timeout), and so does
            # L2 for a page whose file is not there or is in the system's memory: only the disk is waited for.
            reply = runner.lookup_l1(step)
            if reply is None:
                reply = runner.cache.lookup_l2_at_once(step)
                if reply is False:
                    return Waiting(steps, step)
        elif isinstance(step, Background):
            runner.background(step.work)
            reply = None
        else:
            return Waiting(steps, step)


async def run(waiting: Waiting, runner: StepRunner, context: Any) -> Answer | None:
    """Perform the step that must wait, and ``advance`` on, until the flow answers: the Answer, or None to pass
    the request to the site."""
    reply: Any
    while True:
        step = waiting.step
        if isinstance(step, Lookup):
            reply = await runner.lookup_l2(step)  # advance() stops at a lookup only when L2 must wait for the disk
        elif isinstance(step, Fill):
            reply = await runner.fill(step.key, step.client, context)
        else:
            reply = await runner.blocking(step.work)
        progress = advance(waiting.steps, runner, reply)
        if not isinstance(progress, Waiting):
            return progress
        waiting = progress


def run_blocking(steps: Steps | None, runner: StepRunner, context: Any) -> Answer | None:
    """``advance`` and ``run`` for a thread: a runner whose steps block, and never suspend, runs them to the end
    in one send."""
    progress = advance(steps, runner)
    if not isinstance(progress, Waiting):
        return progress
    running = run(progress, runner, context)
    try:
        running.send(None)
    except StopIteration as finished:
        answer: Answer | None = finished.value
        return answer
    running.close()
    raise RuntimeError("a blocking step runner suspended")


class CrawlerFlow:
    """The sequence of one gate's requests (its core, invalidation and access log)."""

    def __init__(self, core: GateCore, invalidation: Invalidation, access_log: AccessLog | None) -> None:
        self.core = core
        self.invalidation = invalidation
        self.access_log = access_log
        self.cache = core.cache
        self.metrics = core.metrics
        self.writes = core.writes
        self.prefetcher = Prefetcher(core.cache.prefetch)

    def prepare(self, request: Request, runner: StepRunner, started: float) -> Prepared:
        """Decide a request and take its flow as far as it goes without waiting (``started``: a perf_counter)."""
        decision = self.core.decide(request)
        if decision.route is Route.ADMIN:
            return Prepared(request, decision, None, started)
        return Prepared(request, decision, advance(self.answer(request, decision), runner), started)

    def answer_at_once(self, request: Request, runner: StepRunner, started: float) -> Response | Prepared:
        """The whole response, counted and logged, when the gate has it at once (a crawler's L1 hit, a page small
        enough to write in one go); else the request prepared, to go on the adapter's way."""
        prepared = self.prepare(request, runner, started)
        answer = prepared.progress
        if isinstance(answer, Answer) and len(answer.response[2]) <= SEND_PIECE_BYTES:
            self.finish(request, prepared.decision, answer, started)
            return answer.response
        return prepared

    def answer_later(self, prepared: Prepared, runner: StepRunner, context: Any, *, may_wait: bool) -> Later | None:
        """The coroutine that gives the answer to a request ``answer_at_once`` prepared (its steps run on), and the
        call that counts it once sent; None when the site answers at once (passed, or a request to the admin), or
        the request may not wait here (it goes the adapter's way, ``_handed_on``)."""
        if not may_wait:
            self._handed_on(prepared)
            return None
        return self._answer_later(prepared, runner, context) if prepared.progress else None

    async def _answer_later(self, prepared: Prepared, runner: StepRunner, context: Any) -> Answered | None:
        """None: the site answers after all (the prepared request now says so, for the adapter's way)."""
        answer = prepared.progress
        if isinstance(answer, Waiting):
            answer = await run(answer, runner, context)
        if answer is None:
            prepared.progress = None
            return None
        return answer.response, functools.partial(self.finish, prepared.request, prepared.decision, answer,
                                                  prepared.started)  # fmt: skip

    def _handed_on(self, prepared: Prepared) -> None:
        """``prepared`` goes the adapter's own way, which the server may never run (uvicorn answers 503 itself past
        its connection limit): a fill the valve let through gives its place back (counted when it begins, if it
        does)."""
        waiting = prepared.progress
        if isinstance(waiting, Waiting) and isinstance(waiting.step, Fill):
            self.core.valve.withdrawn(waiting.step.key.digest)

    def answer(self, request: Request, decision: Decision) -> Steps | None:
        """The steps to the answer the gate gives itself; None: the site answers (every request routed to PASS)."""
        route = decision.route
        if route is Route.CACHE:
            return self._from_cache(request, decision)
        if route is Route.PASS:
            return None
        return self._own_answer(request, decision)

    def _own_answer(self, request: Request, decision: Decision) -> Steps:
        """PURGE, DENY and TOO_LONG: answered without the cache."""
        route = decision.route
        if route is Route.PURGE:
            purge = self.invalidation.purge
            response = yield Blocking(functools.partial(purge, request.peer, request.headers, request.raw_path,
                                                        request.query))  # fmt: skip
            return Answer(response, "")
        if route is Route.DENY:
            return Answer(self.core.deny(), "denied")
        return Answer(plain_response(414, b"URI Too Long\n", outcome=b"pass"), "pass")

    def finish(
        self, request: Request, decision: Decision, answer: Answer, started: float, left_at: int | None = None
    ) -> None:
        """Count an answer the gate gave itself, once sent, and log it. ``left_at``: the client left after that
        many bytes of its body (``LEFT_BEFORE_HEAD``: before its head, logged 499 as nginx does); None: it went
        whole. Counted either way: the gate did the work (a fill stored its page)."""
        if not answer.outcome:
            return
        verdict = decision.verdict
        ttfb_ms = self.metrics.record_for(verdict, answer.outcome, started, answer.saved_ms)
        if self.access_log is not None:
            status, _, body = answer.response
            size = len(body)
            if left_at is not None:
                status, size = (499, 0) if left_at == LEFT_BEFORE_HEAD else (status, left_at)
            self.access_log.log(request, status, size, ttfb_ms, answer.outcome, verdict, decision.reasons)

    def passing(self, request: Request, decision: Decision, started: float) -> Passing:
        """Watch a request on its way to the site (the valve counts it in flight from now)."""
        return Passing(self, request, decision, started)

    def _from_cache(self, request: Request, decision: Decision) -> Steps:
        core = self.core
        key = decision.key
        assert key is not None
        method, headers = request.method, decision.headers
        found = yield key
        variant = core.variant_for(key, found.page if found is not None else None, headers)
        if variant is not None:  # the site serves each device its own page: this device's copy
            key = variant
            found = yield key
        now = core.clock()
        if core.note_demand(key, now):
            yield Background(core.catalogue.upkeep)
        step = core.serve_or_fill(key, found, now)
        if isinstance(step, CacheHit):
            header, outcome = _HIT[step.level]
            page = step.page
            if _heavy(page, headers):
                return Answer((yield _rendering(page, method, headers, header, now)), outcome, page.generation_ms)
            return Answer(page_response(page, method, headers, outcome=header, now=now), outcome, page.generation_ms)
        spared = core.spare_site(decision, key, step.stale, method, headers)
        if spared is not None:
            return Answer(*spared)
        client = core.trusted.client(request.peer, request.headers)
        filled = yield Fill(key, client)
        variant = core.variant_for(key, filled.result, headers) if isinstance(filled.result, Page) else None
        if variant is not None:  # the page turned out to vary by device: fill this device's copy too
            key = variant
            filled = yield Fill(key, client)
        return (yield from self._after_fill(key, filled, step.stale, method, headers))

    def _after_fill(
        self, key: CacheKey, filled: FillResult, stale: Page | None, method: str, headers: RequestHeaders
    ) -> Steps:
        """The crawler's answer once a fill is over; None: ask the site live.

        Stale beats down: when the site failed, or sent half a page, an L2 copy of any age is served.
        A redirect to the URL itself is never handed to a crawler from a fill: the live site answers
        the crawler's own request, which carries its real scheme.
        """
        result, error = filled.result, filled.error
        if isinstance(error, PassedOn):
            return None
        if isinstance(result, Page):
            if _heavy(result, headers):
                return Answer((yield _rendering(result, method, headers, b"miss", None)), "miss")
            return Answer(page_response(result, method, headers, outcome=b"miss"), "miss")
        if result is None or any(result.has(reason) for reason in _FAILED_FILL):
            if stale is None:
                stale = yield Blocking(functools.partial(self.cache.stale_copy, key))
            if stale is not None:
                return Answer((yield _rendering(stale, method, headers, b"stale", self.core.clock())), "stale")
        if result is None or result.has("incomplete"):
            status = 504 if isinstance(error, OriginTimeout) else 502
            return Answer(plain_response(status, b"The site did not answer.\n", outcome=b"miss"), "error")
        if result.has("redirect-to-self"):
            return None
        response = result.response
        return Answer((response.status, origin_headers(response), b"" if method == "HEAD" else response.body), "miss")


def _heavy(page: Page, headers: RequestHeaders) -> bool:
    """Whether answering with ``page`` is work for a thread: decompressing a large page for a client without gzip
    (an 8 MB page takes tens of milliseconds)."""
    return len(page.body_gz) > HEAVY_PAGE_BYTES and not accepts_gzip(headers.accept_encoding)


def _rendering(page: Page, method: str, headers: RequestHeaders, outcome: bytes, now: float | None) -> Blocking:
    """``page`` as the answer to this request, rendered in a thread (rare paths, and large pages)."""
    return Blocking(functools.partial(page_response, page, method, headers, outcome=outcome, now=now))


class Passing:
    """A request on its way to the site. The adapter calls ``answered`` at the answer's head, ``body`` for each
    piece once sent, ``finished`` once it is all sent, ``left`` when the site is done with it (whatever happened),
    and, when the site answered without failing, ``follow_up`` for the work to run after it."""

    __slots__ = (
        "_flow",
        "request",
        "decision",
        "started",
        "status",
        "location",
        "sent",
        "ttfb_ms",
        "form",
        "_in",
        "_head",
        "_head_at",
        "_logged",
    )

    def __init__(self, flow: CrawlerFlow, request: Request, decision: Decision, started: float) -> None:
        self._flow = flow
        self.request = request
        self.decision = decision
        self.started = started
        self.status = 0
        self.location = b""
        self.sent = 0
        self.ttfb_ms = -1.0
        # The first bytes of a form the write rules read (the adapter keeps them as the site reads the body).
        self.form: bytearray | None = None
        self._in = True
        # The answer's headers, looked at once its body's first bytes went (``body``) or the site is done (``left``).
        self._head: Iterable[tuple[bytes, bytes]] | Iterable[tuple[str, str]] | None = None
        self._head_at = 0.0
        self._logged = False
        flow.core.valve.entered()

    def wants_form(self, content_type: Callable[[], bytes]) -> bool:
        """Whether the write rules read this request's form (its ``content_type`` is asked only then): the adapter
        keeps a copy of the body in ``form`` when True."""
        request, writes = self.request, self._flow.writes
        if request.method not in writes.methods or not writes.wants_form(request.method, request.path):
            return False
        return content_type().lower().startswith(FORM_TYPES)

    def answered(self, status: int, headers: Iterable[tuple[bytes, bytes]] | Iterable[tuple[str, str]]) -> None:
        """The site's answer begins. Its cookie, (first) Location and the page's speed for the valve are noted
        after its first body bytes are sent: a server holds a head until then, and a person waits for neither."""
        self.status = status
        self._head = headers
        self._head_at = time.perf_counter()  # the page's speed: the origin's time to its head

    def _note_head(self) -> None:
        headers, self._head = self._head or (), None
        client = self.decision.client
        for name, value in headers:
            lowered = name.lower()
            if lowered in _SET_COOKIE and client is not None:
                self._flow.core.judge.cookie_offered(client)
                client = None
            elif lowered in _LOCATION and not self.location:
                self.location = value if isinstance(value, bytes) else value.encode("latin-1")
        key = self.decision.key
        if key is not None and self.status < 500:  # a page's speed (not a static file's, nor an error's)
            self._flow.core.valve.sample((self._head_at - self.started) * 1000, key.digest)

    def body(self, size: int, *, last: bool = False) -> None:
        """A piece of the body went out (the first one is the time to first byte); the ``last`` one: ``finished``."""
        if self._head is not None:
            self._note_head()
        if self.ttfb_ms < 0:
            self.ttfb_ms = self._flow.metrics.record_for(self.decision.verdict, "pass", self.started)
        self.sent += size
        if last:
            self.finished()

    def finished(self) -> None:
        """The answer is sent whole: its origin time counted, its line logged."""
        flow, decision = self._flow, self.decision
        if self.ttfb_ms < 0:
            self.body(0)
        flow.metrics.add_origin_time(decision.kind, (time.perf_counter() - self.started) * 1000)
        # No status: a WSGI app that failed (or gave no answer) before start_response; the server answers 500.
        self._log(self.status or 500, self.ttfb_ms)

    def left(self) -> None:
        """The site is done with the request (answered, failed or abandoned): no longer in flight. An answer never
        sent whole is logged now: with nginx's 499 when the client left before it began (500 when the site failed
        before it, as the server then answers), else with its status and the bytes that went."""
        if self._head is not None:
            self._note_head()
        if self._in:
            self._in = False
            self._flow.core.valve.left()
        if not self._logged:
            # Called in the adapter's ``finally``: an exception on its way out is the site's failure.
            status = self.status or (500 if isinstance(sys.exc_info()[1], Exception) else 499)
            self._log(status, self.ttfb_ms if self.ttfb_ms >= 0 else (time.perf_counter() - self.started) * 1000)

    def _log(self, status: int, ttfb_ms: float) -> None:
        self._logged = True
        access_log = self._flow.access_log
        if access_log is not None:
            decision = self.decision
            request = self.request
            # A HEAD answer's body, if the app wrote one, is dropped by the server: nothing was sent.
            sent = self.sent if request.method != "HEAD" else 0
            access_log.log(request, status, sent, ttfb_ms, "pass", decision.verdict, decision.reasons)

    def follow_up(self) -> Callable[[], object] | None:
        """The work to run in the background once the site answered without failing: the write rules' marks
        after a successful unsafe request. A human's view of a page is queued for prefetching here."""
        flow, decision, request = self._flow, self.decision, self.request
        key = decision.key
        if key is not None and flow.core.should_prefetch(decision, self.status):
            # Most human views are of pages L1 already holds: with the embedded L1 that is settled here.
            if not flow.cache.touch_local_l1(key):
                flow.prefetcher.offer(key)
            return None
        # A program's anonymous write (curl, a script: a crawler's verdict) marks nothing: a board answers a guest's
        # post with 200 "not allowed", and marks would be anyone's lever on the regeneration budget. A session's
        # or a browser's write is a person's.
        if request.method in flow.writes.methods and 200 <= self.status < 400 and decision.verdict.kind == "human":
            fields = form_fields(bytes(self.form)) if self.form is not None else None
            after_write = flow.invalidation.after_write
            return functools.partial(after_write, request.method, request.path, request.query, fields, self.location)
        return None


def origin_headers(response: OriginResponse) -> list[tuple[bytes, bytes]]:
    """A guest response's headers as sent on to a crawler that asked for an unstored page (no cookies)."""
    headers = [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in response.headers
        if name not in _PER_RESPONSE_HEADERS
    ]
    if response.status not in (204, 304):  # neither has a body to frame (RFC 9110 8.6 forbids it on a 204)
        headers.append((b"content-length", b"%d" % len(response.body)))
    headers.append((b"x-crawlergate", b"miss"))
    return headers
