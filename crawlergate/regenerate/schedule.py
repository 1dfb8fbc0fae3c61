"""The off-peak job and the APScheduler scheduler that ticks it.

APScheduler runs a short tick every minute (``regenerate.check_seconds``), with
``AsyncIOScheduler`` in the ASGI lifespan and ``serve`` and ``BackgroundScheduler`` for WSGI.
The tick writes the human requests counted since the last one, and starts a pass when a
window is open (``window.py``) that no pass has served yet, and this process holds the lease
(``lease.py``). Deciding that on each tick means a window is not lost to a restart at 04:00 (a
process that starts within it runs the pass), and an ``auto`` window that moves needs no
rescheduling.

    job = OffPeakJob(regenerator, state, Window(settings.regenerate, state), Lease(state, l1), metrics)
    scheduler = start_async_scheduler(job)
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import anyio
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from crawlergate.gate.catalogue import IndexUnavailable
from crawlergate.metrics import Metrics
from crawlergate.regenerate.lease import Lease
from crawlergate.regenerate.regenerator import PassSummary, Regenerator, Selection
from crawlergate.regenerate.state import RegenerationState
from crawlergate.regenerate.window import Window

logger = logging.getLogger(__name__)


class Scheduler(Protocol):
    """What the start functions return: a running APScheduler scheduler."""

    def shutdown(self, wait: bool = True) -> None: ...


class OffPeakJob:
    """What the scheduler's tick does: count human traffic, and run a pass when a window opens."""

    def __init__(
        self,
        regenerator: Regenerator,
        state: RegenerationState,
        window: Window,
        lease: Lease,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.regenerator = regenerator
        self.state = state
        self.window = window
        self.lease = lease
        self.metrics = metrics
        self.clock = clock
        self.running = False
        self.closed = False
        self._counted_humans = 0
        self.task: asyncio.Task[PassSummary | None] | None = None
        # The scheduler's tick under way on the event loop: shutdown waits for it rather than have the loop cancel
        # it mid-thread (the scheduler logs a cancelled job as a failure, with a traceback).
        self.ticking: asyncio.Task[Any] | None = None
        self.thread: threading.Thread | None = None

    def tick(self) -> float | None:
        """Write the human requests counted since the last tick; the start of a window to serve now, or None.

        It also reads the page catalogue, as crawler requests do: a gate that sees none still learns of pages
        another process regenerated, and drops its in-memory copies of them. A busy or broken index is
        logged and the tick skipped.
        """
        if self.closed:
            return None
        try:
            self.regenerator.core.catalogue.refresh(wait=False)
            now = self.clock()
            humans = self.metrics.requests("human")
            # A row every tick, none for hours the gate was down: those are not quiet, only uncounted.
            self.state.add_human_requests(int(now // 3600), humans - self._counted_humans)
            self._counted_humans = humans
            if self.running:
                return None
            opened = self.window.opened_at(now)
            if opened is None or self._served(opened):
                return None
        except IndexUnavailable as exc:
            logger.warning("regeneration: %s", exc)
            return None
        return opened

    def _served(self, opened: float) -> bool:
        start = self.state.served_window()
        return start is not None and (start >= opened or self.window.same_window(start, opened))

    def stop(self, wait_s: float = 0.0) -> None:
        """No more windows; a pass under way starts no more fetches (and a WSGI pass's thread is waited for)."""
        self.closed = True
        self.regenerator.stop()
        if self.thread is not None:
            self.thread.join(wait_s)

    async def run_window(self, opened: float) -> PassSummary | None:
        """The pass of the window that opened at ``opened``, if this process gets the lease and no one served it.

        A window whose every fetch failed (the site down, no address to ask it by) is not recorded as served:
        the next tick within it tries again. Failures are logged in one line, never raised.
        """
        self.running = True
        try:
            return await self._run_window(opened)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("regeneration window failed: %s: %s", type(exc).__name__, exc)
            return None
        finally:
            self.running = False

    async def _run_window(self, opened: float) -> PassSummary | None:
        holder = await anyio.to_thread.run_sync(self.lease.take)
        if holder is not None:
            return None  # another process runs the pass (it logs it)
        try:
            if await anyio.to_thread.run_sync(self._served, opened):
                return None
            now = self.clock()
            settings = self.window.settings
            left_s = opened + settings.max_seconds - now
            logger.info("regeneration window opened; the pass may take %.0f s", left_s)
            summary = await self.regenerator.run(
                Selection(dirty=True, revalidate=settings.revalidate_pages > 0),
                time_limit_s=max(0.0, left_s),
                windows_per_day=self.window.per_day(now),
            )
            served = not (summary.pages and summary.errors == summary.pages)
            if served:
                await anyio.to_thread.run_sync(
                    lambda: self.state.record_window(summary.as_dict(), scheduled_start=opened)
                )
            logger.info(
                "regeneration window: %d pages (%d changed, %d errors) in %.1f s; %d marked pages wait%s",
                summary.pages,
                summary.changed,
                summary.errors,
                summary.seconds,
                summary.remaining,
                "" if served else "; every fetch failed, the next check tries again",
            )
            return summary
        finally:
            await anyio.to_thread.run_sync(self.lease.release)

    async def tick_async(self) -> None:
        self.ticking = asyncio.current_task()
        try:
            opened = await anyio.to_thread.run_sync(self.tick)
        except asyncio.CancelledError:
            if self.closed:
                # The server's loop ended under a tick that began after shutdown waited for ticks (or outlasted the
                # wait): the tick's thread ends on its own, and APScheduler would log the cancel as a failed job.
                return
            raise
        finally:
            self.ticking = None
        if opened is not None and not self.closed:
            self.running = True  # until the task's pass ends
            self.task = asyncio.get_running_loop().create_task(self.run_window(opened))

    def tick_blocking(self) -> None:
        opened = self.tick()
        if opened is not None and not self.closed:
            self.running = True  # until the thread's pass ends
            self.thread = threading.Thread(
                target=asyncio.run, args=(self.run_window(opened),), name="crawlergate-regenerate", daemon=True
            )
            self.thread.start()

    def status(self) -> dict[str, Any]:
        """The `stats` part: the window setting, the next window, the last one (whoever ran it: a worker's
        window or the `regenerate` command), and the revalidations so far."""
        now = self.clock()
        settings = self.window.settings
        # Whoever holds the lease runs a pass: a worker's window or the command, the same answer in every worker.
        holder = self.lease.holder_now()
        data: dict[str, Any] = {"enabled": settings.enabled, "window": settings.window, "running": holder is not None}
        data["running_in"] = holder
        if self.window.auto:
            hour, learned = self.window.hour(now)
            data["auto_hour"] = hour
            data["auto_learned"] = learned
        data["next_window"] = self.window.next_start(now) if settings.enabled else None
        totals = self.state.totals()
        data["last_window"] = self.state.last_window()
        data["revalidations"] = int(totals.get("revalidated", 0))
        data["revalidations_changed"] = int(totals.get("revalidations_changed", 0))
        return data

    def prometheus(self) -> tuple[dict[str, float], dict[str, tuple[str, int]]]:
        """Gauges of the last and next window, and the revalidation counters."""
        status = self.status()
        last = status["last_window"] or {}
        gauges = {
            "crawlergate_regeneration_next_window_timestamp_seconds": status["next_window"] or 0,
            "crawlergate_regeneration_last_start_timestamp_seconds": last.get("start", 0),
            "crawlergate_regeneration_last_pages": last.get("pages", 0),
            "crawlergate_regeneration_last_errors": last.get("errors", 0),
            "crawlergate_regeneration_last_seconds": last.get("seconds", 0),
            "crawlergate_regeneration_last_origin_seconds": last.get("origin_seconds", 0),
            "crawlergate_regeneration_running": int(status["running"]),
        }
        counters = {
            "crawlergate_revalidations_total": ("Pages with no change signal fetched again.", status["revalidations"]),
            "crawlergate_revalidations_changed_total": (
                "Revalidations that found the page changed.",
                status["revalidations_changed"],
            ),
        }
        return gauges, counters


def start_async_scheduler(job: OffPeakJob) -> Scheduler:
    """The tick, every ``regenerate.check_seconds`` on the running event loop."""
    return _ticking(AsyncIOScheduler(), job.tick_async, job)


def start_background_scheduler(job: OffPeakJob) -> Scheduler:
    """The tick, every ``regenerate.check_seconds`` in a thread of its own (WSGI servers have no event loop)."""
    return _ticking(BackgroundScheduler(daemon=True), job.tick_blocking, job)


def _ticking(scheduler: Any, tick: Callable[[], object], job: OffPeakJob) -> Scheduler:
    scheduler.add_job(tick, IntervalTrigger(seconds=job.window.settings.check_seconds), max_instances=1, coalesce=True)
    scheduler.start()
    started: Scheduler = scheduler
    return started
