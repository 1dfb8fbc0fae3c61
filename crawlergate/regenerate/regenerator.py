"""One regeneration pass: fetch changed pages again, most valuable first, within what the origin bears.

Koehl and Wang regenerate changed threads at 4 am, so crawlers "always receive fresh content from
their perspective" and the origin never pays for it at peak (section 5.4). A pass takes the pages
marked changed (most crawler demand first, then the longest marked), then, for sites that announce
no changes, the pages Azar et al.'s optimal rates say are due (``rates``), and fetches each as a
guest fill does, through the gate's own filler: same sub-request, storable rules, single-flight.

What a fetch leaves behind:
- a page that stores: the new copy, mark cleared (unless marked again while it was fetched); the
  same body keeps its ETag and Last-Modified, so conditional crawler requests still get 304;
- a 404/410 the storable rules do not keep: the page is removed from both levels;
- an origin error, a cut body or an answer that may not be stored: the old copy and its mark stay.

The budget: at most ``max_pages`` fetches, none started after the time limit, ``concurrency`` at
once and ``rate`` a second, the origin's time on them at most ``origin_share`` of the time passing,
and fewer at once while the origin slows down (``budget.Throttle``). What does not
fit stays marked for the next window. A pass killed half-way loses nothing: marks are cleared only
when a page's new copy is stored, and L2 writes are atomic.

    regenerator = Regenerator(core, filler, fetch, state, settings.regenerate)
    summary = await regenerator.run(Selection(dirty=True, revalidate=True))
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field

import anyio

from crawlergate.config import RegenerateSettings
from crawlergate.errors import OriginError
from crawlergate.gate.catalogue import StoredPage
from crawlergate.gate.engine import GateCore
from crawlergate.gate.fill import Filler
from crawlergate.gate.origin import OriginResponse
from crawlergate.keys import CacheKey
from crawlergate.page import Page
from crawlergate.regenerate.budget import Pacing, Throttle
from crawlergate.regenerate.rates import WindowPlan, change_rate, optimal_rates, plan_window
from crawlergate.regenerate.state import History, Refetch, RegenerationState

logger = logging.getLogger(__name__)

DAY_S = 86400.0
# Re-fetch histories are written in batches of this many (a killed pass loses at most these).
HISTORY_BATCH = 200
# How long a pass waits for the filled pages on their way to the catalogue, at its start and its end.
WRITES_WAIT_S = 30.0
_GONE = (404, 410)
# Failed fetches of a pass logged and kept in its summary.
ERROR_SAMPLES = 5
# A pass stops when this many stored pages, and nearly all it fetched, now answer 404/410: more likely a wrong
# origin (or a site that lost its database) than a site that deleted them all.
GONE_ALARM_PAGES = 10
GONE_ALARM_SHARE = 0.9


def _mostly_gone(summary: PassSummary) -> bool:
    gone = summary.gone + summary.removed
    return gone >= GONE_ALARM_PAGES and gone >= GONE_ALARM_SHARE * summary.pages


@dataclass(frozen=True, slots=True)
class Selection:
    """What a pass fetches: the marked pages, every stored page, given URLs, and/or Azar revalidations."""

    dirty: bool = True
    all_pages: bool = False
    urls: Sequence[str] = ()
    revalidate: bool = False


@dataclass
class PassSummary:
    """What a pass did (the `regenerate` summary, the `stats` last window)."""

    start: float = 0.0  # Unix time
    pages: int = 0  # fetched
    changed: int = 0  # stored, with a new body
    unchanged: int = 0  # stored, same body: same ETag
    gone: int = 0  # a stored page that now answers 404/410, stored as such
    removed: int = 0  # 404/410 and not kept: gone from the cache
    not_stored: int = 0  # an answer the storable rules refuse: old copy and mark kept
    errors: int = 0  # the origin failed or cut the body: old copy and mark kept
    not_cacheable: int = 0  # given URLs the cache rules exclude
    revalidated: int = 0  # pages with no change signal fetched by their Azar rate
    revalidations_changed: int = 0  # of those, how many had changed
    remaining: int = 0  # marked pages still waiting, for the next window
    seconds: float = 0.0
    origin_seconds: float = 0.0  # the origin's time spent answering the pass
    backoffs: int = 0  # times the pass slowed down because the origin did
    busiest: int = 0  # the most fetches at once
    stopped: str = "done"  # or "time limit", "page budget", "shutdown", "pages gone"
    error_samples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Job:
    """One fetch of the pass; a revalidation's turn in the window's EDF plan, or None for a marked page."""

    key: CacheKey
    revalidation: int | None = None


class Regenerator:
    """Regeneration passes for one gate.

    Parameters:
        core: the gate (cache, page catalogue, keys, clock).
        filler: the gate's filler; every fetch goes through it.
        fetch: the guest sub-request for a key, as the gate's fills make it.
        state: the re-fetch histories and window records.
        settings: the budget.
    """

    def __init__(
        self,
        core: GateCore,
        filler: Filler,
        fetch: Callable[[CacheKey], Awaitable[OriginResponse]],
        state: RegenerationState,
        settings: RegenerateSettings,
    ) -> None:
        self.core = core
        self.filler = filler
        self.fetch = fetch
        self.state = state
        self.settings = settings
        # Set by ``stop``: workers start no more fetches (the gate is shutting down).
        self.stopping = False

    def stop(self) -> None:
        self.stopping = True

    async def run(
        self,
        selection: Selection,
        *,
        time_limit_s: float | None = None,
        max_pages: int | None = None,
        windows_per_day: float = 1.0,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> PassSummary:
        """One pass; ``time_limit_s`` and ``max_pages`` default to the settings' window length and page budget;
        ``windows_per_day`` is how many windows a day the revalidation budget is spent in."""
        started = time.monotonic()
        summary = PassSummary(start=self.core.clock())
        limit_s = self.settings.max_seconds if time_limit_s is None else time_limit_s
        budget = self.settings.max_pages if max_pages is None else max_pages
        jobs, schedule, truncated = await anyio.to_thread.run_sync(
            self._plan, selection, budget, windows_per_day, summary
        )
        throttle = Throttle(self.settings.concurrency, self.settings.backoff_factor)
        pacing = Pacing(self.settings.rate, self.settings.origin_share)
        deadline = started + limit_s
        history: list[Refetch] = []
        next_job = 0
        done = 0

        def over() -> bool:
            if self.stopping:
                summary.stopped = "shutdown"
            elif time.monotonic() >= deadline:
                summary.stopped = "time limit"
            elif _mostly_gone(summary):
                summary.stopped = "pages gone"
            return summary.stopped != "done"

        async def work() -> None:
            nonlocal next_job, done
            while True:
                await throttle.acquire(deadline)
                try:
                    # The waits for a slot and for the pace may end past the deadline: it is checked after them.
                    if next_job >= len(jobs) or over():
                        return
                    if not await pacing.wait(deadline):
                        summary.stopped = "time limit"  # the next turn would come after it
                        return
                    if next_job >= len(jobs) or over():  # another worker took the last job during the wait
                        return
                    job = jobs[next_job]
                    next_job += 1
                    answered = await self._regenerate(job, summary, throttle, pacing, history)
                    if answered and schedule is not None and job.revalidation is not None:
                        schedule.done.add(job.revalidation)
                finally:
                    await throttle.release()
                done += 1
                if on_progress is not None:
                    on_progress(done, len(jobs))
                if len(history) >= HISTORY_BATCH:
                    batch, history[:] = list(history), []
                    await anyio.to_thread.run_sync(self.state.record_refetches, batch)

        try:
            # A task group: should one worker fail (the index unusable), the others stop with it.
            async with asyncio.TaskGroup() as workers:
                for _ in range(self.settings.concurrency):
                    workers.create_task(work())
        finally:
            await anyio.to_thread.run_sync(self._finish, schedule, history, summary)
        if truncated and summary.stopped == "done":
            summary.stopped = "page budget"
        summary.seconds = time.monotonic() - started
        summary.backoffs = throttle.backoffs
        summary.busiest = throttle.busiest
        return summary

    def _plan(
        self, selection: Selection, budget: int, windows_per_day: float, summary: PassSummary
    ) -> tuple[list[_Job], _Revalidation | None, bool]:
        """The fetches of the pass in order, the revalidation schedule they end with (if any), and whether the
        page budget left pages out."""
        self.filler.writer.flush(WRITES_WAIT_S)  # the pages crawlers were just answered with, in the catalogue
        held = self.core.cache.l2
        catalogue = self.core.catalogue.stored_pages(dirty_only=not (selection.all_pages or selection.revalidate))
        stored = [page for page in catalogue if held.has_file(page.digest)]
        keys: dict[str, CacheKey] = {}
        for url in selection.urls:
            key = self.core.keys.key_for_url(url)
            if key is None:
                summary.not_cacheable += 1
            else:
                keys.setdefault(key.digest, key)
        if selection.dirty or selection.all_pages:
            for page in stored:
                if selection.all_pages or page.dirty_since is not None:
                    key = self.core.keys.key_for_url(page.target)
                    if key is not None:
                        keys.setdefault(page.digest, key)
        jobs = [_Job(key) for key in keys.values()]
        truncated = bool(budget) and len(jobs) > budget
        if budget:
            jobs = jobs[:budget]
        slots = self.settings.revalidate_pages
        if budget:
            slots = min(slots, budget - len(jobs))
        if not selection.revalidate or slots <= 0:
            return jobs, None, truncated
        candidates = [page for page in stored if page.dirty_since is None and page.digest not in keys]
        schedule = _Revalidation.plan(candidates, self.state, self.settings.revalidate_pages, slots, windows_per_day)
        for turn, page in enumerate(schedule.pages):
            key = self.core.keys.key_for_url(page.target)
            if key is None:  # no longer cacheable by the rules: nothing to fetch, its turn is taken
                schedule.done.add(turn)
            else:
                jobs.append(_Job(key, revalidation=turn))
        return jobs, schedule, truncated

    async def _regenerate(
        self, job: _Job, summary: PassSummary, throttle: Throttle, pacing: Pacing, history: list[Refetch]
    ) -> bool:
        """Fetch one page again and count what came of it; False when the site failed (its turn is not spent)."""
        key = job.key
        previous = await anyio.to_thread.run_sync(self.core.cache.stale_copy, key)
        fetched_at = self.core.clock()

        async def timed() -> OriginResponse:
            began = time.monotonic()
            try:
                return await self.fetch(key)
            finally:
                elapsed = time.monotonic() - began
                summary.origin_seconds += elapsed
                throttle.observe(elapsed)
                pacing.spent(began, elapsed)

        summary.pages += 1
        try:
            result = await self.filler.fill(key, timed, previous=previous)
        except OriginError as exc:
            self._failed(summary, key, str(exc))
            return False
        if isinstance(result, Page):
            changed = previous is None or previous.etag != result.etag
            if result.status in _GONE and (previous is None or previous.status not in _GONE):
                summary.gone += 1
            elif changed:
                summary.changed += 1
            else:
                summary.unchanged += 1
            if previous is not None:
                history.append(Refetch(key.digest, changed, fetched_at - previous.generated_at))
            if job.revalidation is not None:
                summary.revalidated += 1
                summary.revalidations_changed += changed
            return True
        if result.has("origin-error") or result.has("incomplete"):
            self._failed(summary, key, f"{key.target}: the site answered {result.response.status}, or cut the body")
            return False
        if result.response.status in _GONE:
            await anyio.to_thread.run_sync(self._remove, key, fetched_at)
            summary.removed += 1
        else:
            summary.not_stored += 1
        return True

    def _remove(self, key: CacheKey, fetched_at: float) -> None:
        self.core.cache.invalidate(key)
        self.core.catalogue.clear(key.digest, fetched_at)

    @staticmethod
    def _failed(summary: PassSummary, key: CacheKey, message: str) -> None:
        """Count a failed fetch; the first few are logged and kept as samples (a site that is down fails them all)."""
        summary.errors += 1
        if len(summary.error_samples) < ERROR_SAMPLES:
            message = message if message.startswith(key.target) else f"{key.target}: {message}"
            summary.error_samples.append(message)
            logger.warning("regeneration failed: %s", message)

    def _finish(self, schedule: _Revalidation | None, history: list[Refetch], summary: PassSummary) -> None:
        """Write what the pass learnt, and count the marked pages still waiting."""
        self.filler.writer.flush(WRITES_WAIT_S)  # the pages the pass stored, unmarked in the catalogue
        self.state.record_refetches(history)
        if schedule is not None:
            self.state.save_credits(schedule.credits_after())
        held = self.core.cache.l2
        summary.remaining = sum(
            1 for page in self.core.catalogue.stored_pages(dirty_only=True) if held.has_file(page.digest)
        )


class _Revalidation:
    """This window's share of the EDF schedule over Azar et al.'s optimal rates, for pages with no change signal.

    Utilities are the pages' crawler demand; change rates are estimated from their re-fetch histories;
    the budget is ``revalidate_pages`` a window, as re-fetches a day, and no page more than once a window.
    The schedule runs on from the credits the last window left; the turns this window does not get to (the
    pass stopped, a fetch failed) keep their credit for the next one.
    """

    def __init__(self, candidates: list[StoredPage], shares: list[float], credits: list[float], plan: WindowPlan):
        self.pages = [candidates[index] for index in plan.picked]
        self.done: set[int] = set()  # turns (indexes into ``pages``) fetched
        self._digests = [page.digest for page in candidates]
        self._shares = shares
        self._credits = credits
        self._plan = plan

    @classmethod
    def plan(
        cls, candidates: list[StoredPage], state: RegenerationState, per_window: int, slots: int, windows_per_day: float
    ) -> _Revalidation:
        """The window's turns: ``per_window`` re-fetches a window (as a budget a day), ``slots`` of them this pass."""
        per_day = per_window * windows_per_day
        histories = state.histories()
        changes = []
        credits = []
        for page in candidates:
            history = histories.get(page.digest) or History()
            changes.append(change_rate(history.fetches, history.changes, history.observed_s) * DAY_S)
            credits.append(history.credit)
        rates = optimal_rates([page.demand for page in candidates], changes, per_day, cap=windows_per_day)
        shares = [rate / per_day for rate in rates]
        return cls(candidates, shares, credits, plan_window(shares, slots, credits))

    def credits_after(self) -> dict[str, float]:
        """The scheduled pages' credits after the turns done in order, up to the first that was not."""
        fetched = next((turn for turn in range(len(self.pages)) if turn not in self.done), len(self.pages))
        after = self._plan.credits_after(self._shares, self._credits, fetched)
        return {
            digest: after[index]
            for index, digest in enumerate(self._digests)
            if self._shares[index] > 0 or self._credits[index]
        }
