"""What every access-log format yields: LogRecord for one request, FieldRow for the fast path, the format protocol.

The formats themselves live in ``logtext`` (Apache and nginx text), ``logjson`` (JSON lines: Caddy,
nginx, Traefik) and ``logw3c`` (W3C extended: IIS, CloudFront); ``logparse`` reads files and
detects which of them a file is written in.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

# (request line, status, bytes, user agent, time), as they stand in the log. The request line is
# "METHOD TARGET [PROTOCOL]"; time is in the format's own notation, read by AccessLogFormat.day_of.
FieldRow = tuple[str, str, str, str, str]


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One request of an access log. ``duration_s`` is None when the log has no response-time field."""

    host: str
    timestamp: float
    method: str
    target: str
    status: int
    bytes_sent: int
    referer: str
    user_agent: str
    duration_s: float | None
    # The authenticated user (%u / $remote_user), "" when the log has "-".
    user: str = ""

    @property
    def path(self) -> str:
        """The target without its query string."""
        return self.target.partition("?")[0]


class AccessLogFormat(Protocol):
    """One way of writing access logs: parses lines into records, or whole blocks into field rows."""

    # Rebuilds the same format in another process: ``logparse.make_format(spec)``.
    spec: str
    # What a person reads: "nginx/Apache combined + 1 extra field (response time in seconds)".
    description: str
    has_duration: bool
    # False when the log does not record user agents: crawlers cannot be told from people in it.
    has_user_agent: bool

    def parse(self, line: str) -> LogRecord | None:
        """The record of one line, or None when the line is not a request in this format."""

    def field_rows(self, text: str) -> list[FieldRow]:
        """The rows of every well-formed request line of a block of whole lines (the fast path)."""

    def day_of(self, when: str) -> int | None:
        """The day (days since 1970-01-01, in the log's own time zone) of a row's time text."""

    def ignored_lines(self, text: str) -> int:
        """Lines of a block that are no requests and no mistakes: blank lines, comments and headers."""


def split_request(request: str) -> tuple[str, str] | None:
    """``GET /path?q HTTP/1.1`` to (method, target); None when it is not a request line."""
    method, _, rest = request.partition(" ")
    target, _, protocol = rest.rpartition(" ")
    if not protocol.startswith("HTTP/"):
        target = rest
    if not method or not target:
        return None
    return method, target


def blank_lines(text: str) -> int:
    # Empty lines only: a line of spaces counts as malformed, which is cheaper to tell and rare.
    return text.count("\n\n") + text.startswith("\n")


@functools.lru_cache(maxsize=4096)
def parse_iso_time(text: str) -> float | None:
    """An ISO 8601 time (nginx ``$time_iso8601``, Traefik's ``StartUTC``) to a Unix timestamp; UTC when no zone."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
