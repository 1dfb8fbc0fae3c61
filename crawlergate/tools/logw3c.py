"""W3C extended logs (IIS, CloudFront): the ``#Fields:`` directive says what each column holds.

IIS separates fields by spaces and writes a space in the user agent as ``+``; CloudFront uses tabs
and percent-encoding. Times are UTC. ``time-taken`` is milliseconds in IIS and seconds in
CloudFront (recognised by its ``x-edge-*`` fields). A ``#Fields:`` line later in the file (IIS
writes the header again after each restart) changes the columns from there on.

    W3cFormat(["date", "time", "cs-method", "cs-uri-stem", "sc-status", "cs(User-Agent)"])
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime
from urllib.parse import unquote

from crawlergate.errors import ConfigError
from crawlergate.tools.logrecord import FieldRow, LogRecord

FIELDS_DIRECTIVE = "#Fields:"


class W3cFormat:
    """A W3C extended log with the given columns."""

    def __init__(self, fields: Sequence[str]) -> None:
        self._set_fields(list(fields))

    @classmethod
    def from_spec(cls, spec: str) -> W3cFormat:
        fields = spec.removeprefix("w3c").removeprefix(":").split()
        if not fields:
            raise ConfigError("A W3C log format needs its fields: --format 'w3c:date time cs-method cs-uri-stem ...'.")
        return cls(fields)

    @classmethod
    def detect(cls, lines: Sequence[str]) -> W3cFormat | None:
        for line in lines:
            if line.startswith(FIELDS_DIRECTIVE):
                return cls(line[len(FIELDS_DIRECTIVE) :].split())
        return None

    def _set_fields(self, fields: list[str]) -> None:
        self.fields = fields
        index = {name.lower(): position for position, name in enumerate(fields)}
        self._date, self._time = index.get("date"), index.get("time")
        self._method, self._stem = index.get("cs-method"), index.get("cs-uri-stem")
        self._query = index.get("cs-uri-query")
        self._status, self._bytes = index.get("sc-status"), index.get("sc-bytes")
        self._agent, self._referer = index.get("cs(user-agent)"), index.get("cs(referer)")
        self._host, self._user, self._taken = index.get("c-ip"), index.get("cs-username"), index.get("time-taken")
        if None in (self._date, self._time, self._method, self._stem, self._status):
            raise ConfigError(
                "W3C #Fields lack date, time, cs-method, cs-uri-stem or sc-status: " + " ".join(fields) + "."
            )
        self._width = len(fields)
        cloudfront = any(name.startswith("x-edge-") for name in index)
        self._taken_unit = 1.0 if cloudfront else 0.001
        self._decode = _cloudfront_decoded if cloudfront else _iis_decoded
        self.has_duration = self._taken is not None
        self.has_user_agent = self._agent is not None
        self.spec = "w3c:" + " ".join(fields)
        server = "CloudFront" if self._taken_unit == 1.0 else "IIS"
        self.description = f"W3C extended ({server}, {len(fields)} fields)"

    def parse(self, line: str) -> LogRecord | None:
        values = self._columns(line)
        if values is None:
            return None
        timestamp = _timestamp(f"{values[self._date]} {values[self._time]}")  # type: ignore[index]
        if timestamp is None:
            return None
        taken = self._field(values, self._taken)
        try:
            duration = float(taken) * self._taken_unit if taken else None
        except ValueError:
            duration = None
        size = self._field(values, self._bytes)
        return LogRecord(
            host=self._field(values, self._host) or "-",
            timestamp=timestamp,
            method=values[self._method],  # type: ignore[index]
            target=self._target(values),
            status=int(values[self._status]),  # type: ignore[index]
            bytes_sent=int(size) if size.isdigit() else 0,
            referer=self._decode(self._field(values, self._referer)),
            user_agent=self._decode(self._field(values, self._agent)),
            duration_s=duration,
            user=self._field(values, self._user),
        )

    def field_rows(self, text: str) -> list[FieldRow]:
        rows = []
        for line in text.splitlines():
            values = self._columns(line)
            if values is None:
                continue
            request = f"{values[self._method]} {self._target(values)}"  # type: ignore[index]
            when = f"{values[self._date]} {values[self._time]}"  # type: ignore[index]
            agent = self._decode(self._field(values, self._agent))
            rows.append((request, values[self._status], self._field(values, self._bytes), agent, when))  # type: ignore[index]
        return rows

    def day_of(self, when: str) -> int | None:
        return _day(when[:10])

    def ignored_lines(self, text: str) -> int:
        return sum(1 for line in text.splitlines() if not line.strip() or line.startswith("#"))

    def _columns(self, line: str) -> list[str] | None:
        if line.startswith("#"):
            if line.startswith(FIELDS_DIRECTIVE):
                previous = self.fields
                try:
                    self._set_fields(line[len(FIELDS_DIRECTIVE) :].split())
                except ConfigError:
                    self._set_fields(previous)  # a damaged header: the columns stay as they were
            return None
        values = line.rstrip("\r\n").split("\t" if "\t" in line else " ")
        if len(values) != self._width or not values[self._status].isdigit():  # type: ignore[index]
            return None
        return values

    def _target(self, values: list[str]) -> str:
        stem = values[self._stem]  # type: ignore[index]
        query = self._field(values, self._query)
        return f"{stem}?{query}" if query else stem

    @staticmethod
    def _field(values: list[str], index: int | None) -> str:
        if index is None:
            return ""
        value = values[index]
        return "" if value == "-" else value


def _iis_decoded(text: str) -> str:
    # IIS writes spaces as '+' and a '+' as itself, so "; +http" arrives as ";++http".
    return text.replace("++", " \x00").replace("+", " ").replace("\x00", "+")


def _cloudfront_decoded(text: str) -> str:
    # CloudFront percent-encodes user agents twice over ("%2520" for a space); a '+' is itself.
    for _ in range(2):
        if "%" not in text:
            break
        text = unquote(text)
    return text


@functools.lru_cache(maxsize=1024)
def _day(date: str) -> int | None:
    stamp = _timestamp(date + " 12:00:00")
    return None if stamp is None else int(stamp // 86_400)


def _timestamp(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None
