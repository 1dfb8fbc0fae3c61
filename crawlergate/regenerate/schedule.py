"""The off-peak window: when regeneration runs, which process runs it, and the APScheduler job that starts it.

The window opens at a cron time (``regenerate.window``: "04:30" or "30 3 * * 1-5") or, with
``auto``, at the quietest hour of the site's human traffic, learned from the gate's own counts
(kept in the dirty index's file, so restarts keep them; learned again each day; 04:00 until a
day is counted). It lasts ``regenerate.max_seconds``.

APScheduler runs a short tick every minute (``regenerate.check_seconds``), with
``AsyncIOScheduler`` in the ASGI lifespan and ``serve`` and ``BackgroundScheduler`` for WSGI.
The tick writes the human requests counted since the last one, and starts a pass when a
window is open that no pass has served yet. Deciding that on each tick, with the window
computed by APScheduler's ``CronTrigger`` from an injectable clock, means a window is not lost
to a restart at 04:00 (a process that starts within it runs the pass), an ``auto`` window that
moves needs no rescheduling, and tests need no sleeping.

One process regenerates at a time: every worker ticks, and the pass needs the lease, held in
memcached (``add`` with a time to live: one across the machines that share L1) or, with the
embedded L1, in the dirty index (one machine). A lease whose holder process died on this machine is
taken over at once; another machine's lapses after the window.

    job = OffPeakJob(regenerator, state, Window(settings.regenerate, state), Lease(state, l1), metrics)
    scheduler = start_async_scheduler(job)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any, Protocol
from zoneinfo import ZoneInfo

import anyio
import tzlocal
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from crawlergate.config import RegenerateSettings
from crawlergate.errors import ConfigError, StoreUnavailable
from crawlergate.gate.dirty import IndexUnavailable
from crawlergate.metrics import Metrics
from crawlergate.regenerate.regenerator import PassSummary, Regenerator, Selection
from crawlergate.regenerate.state import RegenerationState
from crawlergate.stores.memcached import MemcachedStore

logger = logging.getLogger(__name__)

# The hour a window opens until a day of human traffic is counted (the paper's 4 am).
DEFAULT_HOUR = 4
LEASE_KEY = "regenerate-lease"


class Scheduler(Protocol):
    """What the start functions return: a running APScheduler scheduler."""

    def shutdown(self, wait: bool = True) -> None: ...


_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def crontab_weekdays(field: str) -> str:
    """A crontab day-of-week field (0 or 7 is Sunday) as APScheduler 3 day names (its 0 is Monday: issue 286).

    ``1-5`` is ``mon,tue,wed,thu,fri``; names, lists, ranges and steps are read as cron reads them.
    """
    if field == "*":
        return "*"
    days: set[int] = set()
    for part in field.lower().split(","):
        span, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if span == "*":
            first, last = 0, 6
        else:
            low, _, high = span.partition("-")
            first = _day_number(low)
            last = _day_number(high) if high else (6 if step_text else first)
            if last < first:  # "sat-sun"
                last += 7
        if step < 1 or first > last:
            raise ValueError(f"'{part}' is no day-of-week range")
        days.update(day % 7 for day in range(first, last + 1, step))
    return ",".join(_DAY_NAMES[day] for day in sorted(days))


def _day_number(text: str) -> int:
    """0 to 7 as written (7 is Sunday again, so "5-7" runs to it); names from sun = 0."""
    if text in _DAY_NAMES:
        return _DAY_NAMES.index(text)
    if not text.isdigit() or int(text) > 7:
        raise ValueError(f"'{text}' is no day of the week")
    return int(text)


def quietest_hour(counts: dict[int, int], until: float, zone: tzinfo) -> int | None:
    """The local hour of the day with the fewest human requests on average over the week before ``until``, or
    None until a whole day is counted. ``counts`` are requests per hour numbered ``Unix time // 3600``, for
    the hours a gate ran (an hour with no row is one nobody counted, not a quiet one); ties go to the hour
    nearest 04:00."""
    current = int(until // 3600)
    counted = [hour for hour in counts if current - 7 * 24 <= hour < current]
    if not counted or current - min(counted) < 24:
        return None
    totals = [0] * 24
    seen = [0] * 24
    for hour in counted:
        local = datetime.fromtimestamp(hour * 3600, zone).hour
        totals[local] += counts[hour]
        seen[local] += 1
    means = [totals[h] / seen[h] if seen[h] else math.inf for h in range(24)]
    return min(range(24), key=lambda h: (means[h], min((h - DEFAULT_HOUR) % 24, (DEFAULT_HOUR - h) % 24), h))


def check_window(settings: RegenerateSettings) -> None:
    """Raise ConfigError when the window setting is no time or cron expression APScheduler can read."""
    if settings.window.strip() != "auto":
        window_trigger(settings.window.strip(), _zone(settings))


def _zone(settings: RegenerateSettings) -> tzinfo:
    return ZoneInfo(settings.timezone) if settings.timezone else tzlocal.get_localzone()


def window_trigger(window: str, zone: tzinfo) -> BaseTrigger:
    """The trigger of a window setting: "HH:MM" every day, or a five-field crontab expression."""
    try:
        if ":" in window:
            hour, minute = window.split(":")
            return CronTrigger(hour=int(hour), minute=int(minute), timezone=zone)
        minute, hour, day, month, weekdays = window.split()
        times = {"minute": minute, "hour": hour, "month": month, "timezone": zone}
        if day != "*" and weekdays != "*":
            # cron runs on either day when both are given (APScheduler would want both at once).
            return OrTrigger(
                [CronTrigger(day=day, **times), CronTrigger(day_of_week=crontab_weekdays(weekdays), **times)]
            )
        return CronTrigger(day=day, day_of_week=crontab_weekdays(weekdays), **times)
    except ValueError as exc:
        message = f"Setting 'regenerate.window' has value '{window}'. It is no cron expression: {exc}."
        raise ConfigError(message) from None


class Window:
    """When the off-peak windows open, by the settings and (for ``auto``) the counted human traffic."""

    def __init__(
        self, settings: RegenerateSettings, state: RegenerationState, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self.state = state
        self.clock = clock
        self.zone = _zone(settings)
        self.auto = settings.window.strip() == "auto"
        self._fixed = None if self.auto else window_trigger(settings.window.strip(), self.zone)
        self._learned: tuple[object, int, bool] | None = None  # (local date, hour, learned)

    def hour(self, now: float) -> tuple[int, bool]:
        """The auto window's hour for the day of ``now``, and whether it was learned (else the default).

        It is learned from the hours before that day's local midnight, so every worker, whenever it asks,
        finds the same hour for the same day.
        """
        local = datetime.fromtimestamp(now, self.zone)
        today = local.date()
        if self._learned is None or self._learned[0] != today:
            midnight = datetime.combine(today, datetime.min.time(), self.zone).timestamp()
            learned = quietest_hour(self.state.human_hours(), midnight, self.zone)
            self._learned = (today, DEFAULT_HOUR if learned is None else learned, learned is not None)
        return self._learned[1], self._learned[2]

    def trigger(self, now: float) -> BaseTrigger:
        if self._fixed is not None:
            return self._fixed
        # Hours are counted from whole hours of Unix time: in a zone half an hour off (India), so is the window.
        minute = datetime.fromtimestamp(int(now // 3600) * 3600, self.zone).minute
        return CronTrigger(hour=self.hour(now)[0], minute=minute, timezone=self.zone)

    def opened_at(self, now: float) -> float | None:
        """The start of the window open at ``now`` (Unix time), or None when none is."""
        trigger = self.trigger(now)
        start = trigger.get_next_fire_time(None, datetime.fromtimestamp(now - self.settings.max_seconds, self.zone))
        latest = None
        for _ in range(10_000):  # a window shorter than the cron period: one or two starts in range
            if start is None or start.timestamp() > now:
                break
            latest = start
            start = trigger.get_next_fire_time(start, start + timedelta(seconds=1))
        return None if latest is None else latest.timestamp()

    def next_start(self, now: float) -> float | None:
        """When the next window opens after ``now``."""
        after = datetime.fromtimestamp(now, self.zone) + timedelta(seconds=1)
        start = self.trigger(now).get_next_fire_time(None, after)
        return None if start is None else start.timestamp()

    def per_day(self, now: float) -> float:
        """Windows a day, on average over the coming four weeks (at least one in them)."""
        trigger = self.trigger(now)
        end = datetime.fromtimestamp(now, self.zone) + timedelta(days=28)
        starts = 0
        start = trigger.get_next_fire_time(None, datetime.fromtimestamp(now, self.zone))
        while start is not None and start < end and starts < 28 * 24 * 60:
            starts += 1
            start = trigger.get_next_fire_time(start, start + timedelta(seconds=1))
        return max(1, starts) / 28

    def same_window(self, first: float, second: float) -> bool:
        """Whether two starts are one window: equal, or the same local time twice in the hour a clock goes back."""
        if first == second:
            return True
        wall = [datetime.fromtimestamp(start, self.zone).replace(tzinfo=None) for start in (first, second)]
        return wall[0] == wall[1] and abs(first - second) <= 2 * 3600


class Lease:
    """The right to regenerate: one holder at a time, across processes (and machines sharing memcached)."""

    def __init__(self, state: RegenerationState, l1: object, ttl_s: float) -> None:
        self.state = state
        self.memcached = l1 if isinstance(l1, MemcachedStore) else None
        self.ttl_s = ttl_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._in_memcached = False

    def take(self) -> str | None:
        """Take the lease; returns None when taken, else who holds it."""
        if self.memcached is not None:
            try:
                held = self._take_memcached()
            except StoreUnavailable as exc:
                logger.warning("regeneration lease: memcached is unavailable (%s); using this machine's lease", exc)
            else:
                self._in_memcached = held is None
                return held
        return self.state.take_lease(self.holder, self.ttl_s, is_stale=_died_here)

    def _take_memcached(self) -> str | None:
        """``add`` takes a free lease; a released one (empty) or a dead holder's is taken by compare-and-set, so
        of two processes that saw it free, one wins."""
        assert self.memcached is not None
        mine = self.holder.encode()
        for _ in range(3):
            if self.memcached.add_expiring(LEASE_KEY, mine, self.ttl_s):
                return None
            value, token = self.memcached.gets(LEASE_KEY)
            if value is None or token is None:
                continue  # gone meanwhile: add again
            current = value.decode("utf-8", "replace")
            if current and not _died_here(current):
                return current
            if self.memcached.cas(LEASE_KEY, mine, token, self.ttl_s):
                return None
        return "another process"

    def holder_now(self) -> str | None:
        """Who holds the lease now (memcached's, else this machine's), if anyone."""
        if self.memcached is not None:
            with contextlib.suppress(StoreUnavailable):
                value = self.memcached.get(LEASE_KEY)
                return value.decode("utf-8", "replace") if value else None
        return self.state.lease_holder()

    def release(self) -> None:
        """Give the lease up (only if it is still this process's): an empty value for a second marks it free."""
        if self._in_memcached and self.memcached is not None:
            self._in_memcached = False
            with contextlib.suppress(StoreUnavailable):
                value, token = self.memcached.gets(LEASE_KEY)
                if value == self.holder.encode() and token is not None:
                    self.memcached.cas(LEASE_KEY, b"", token, 1)
            return
        self.state.release_lease(self.holder)


def _died_here(holder: str) -> bool:
    """Whether a lease holder ("host:pid:token") was a process of this machine that no longer runs."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    # A killed process its parent has not reaped yet still answers the signal: a zombie is dead too.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


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
        self.thread: threading.Thread | None = None

    def tick(self) -> float | None:
        """Write the human requests counted since the last tick; the start of a window to serve now, or None.

        It also reads the dirty index, as crawler requests do: a gate that sees none still learns of pages
        another process regenerated, and drops its in-memory copies of them. A busy or broken index is
        logged and the tick skipped.
        """
        if self.closed:
            return None
        try:
            self.regenerator.core.dirty.refresh(wait=False)
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
        opened = await anyio.to_thread.run_sync(self.tick)
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
