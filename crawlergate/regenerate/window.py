"""The off-peak window: when regeneration runs.

The window opens at a cron time (``regenerate.window``: "04:30" or "30 3 * * 1-5") or, with
``auto``, at the quietest hour of the site's human traffic, learned from the gate's own counts
(kept in the page catalogue's file, so restarts keep them; learned again each day; 04:00 until a
day is counted). It lasts ``regenerate.max_seconds``. Its times are computed by APScheduler's
``CronTrigger`` from an injectable clock, so tests need no sleeping.

    window = Window(settings.regenerate, state)
    window.opened_at(time.time())   # when the window that is open now opened, or None
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

import tzlocal
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger

from crawlergate.config import RegenerateSettings
from crawlergate.errors import ConfigError
from crawlergate.regenerate.state import RegenerationState

# The hour a window opens until a day of human traffic is counted (the paper's 4 am).
DEFAULT_HOUR = 4

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
