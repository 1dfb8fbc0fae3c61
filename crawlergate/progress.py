"""A progress line for long-running commands, on stderr so it never mixes with results on stdout.

On a terminal it redraws one line; elsewhere (CI, a pipe) it prints a line at most every few
seconds, so logs stay short.

    with Progress("reading access.log", total=size_bytes, unit="bytes") as progress:
        progress.update(done_bytes)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

# How often a non-terminal stream gets a new line; a terminal is redrawn at most ten times a second.
PLAIN_INTERVAL_S = 5.0
TERMINAL_INTERVAL_S = 0.1


class Progress:
    """Shows how far a job is, with a rate and an estimate of the time left."""

    def __init__(
        self,
        label: str,
        total: float,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._started = clock()
        self._last_shown = self._started
        self._terminal = self._stream.isatty()
        self._shown = False

    def update(self, done: float) -> None:
        """Report that `done` of `total` is finished; shown only now and then."""
        now = self._clock()
        interval = TERMINAL_INTERVAL_S if self._terminal else PLAIN_INTERVAL_S
        if now - self._last_shown < interval:
            return
        self._last_shown = now
        self._show(done, now)

    def close(self) -> None:
        if self._shown and self._terminal:
            self._stream.write("\n")
            self._stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _show(self, done: float, now: float) -> None:
        elapsed = max(now - self._started, 1e-9)
        fraction = min(done / self.total, 1.0) if self.total > 0 else 0.0
        left = f", {elapsed / fraction - elapsed:.0f} s left" if 0 < fraction < 1 else ""
        text = f"{self.label}: {fraction:6.1%} ({_human(done)}{self.unit} of {_human(self.total)}{self.unit}{left})"
        if self._terminal:
            self._stream.write("\r" + text.ljust(78))
        else:
            self._stream.write(text + "\n")
        self._stream.flush()
        self._shown = True


def _human(value: float) -> str:
    for unit in ("", "k", "M", "G", "T"):
        if abs(value) < 1000:
            return f"{value:.0f}{unit}" if unit == "" else f"{value:.1f}{unit}"
        value /= 1000
    return f"{value:.1f}P"
