"""JSON-lines access logs: Caddy's default, nginx ``log_format ... escape=json``, Traefik's ``format: json``.

Each field is looked for under the names these servers use (FIELD_NAMES); the first name present
in the first request of the file wins for the whole file. An operator maps other names in the
format spec: ``--format 'json:user_agent=req.ua,time=@timestamp'`` (dotted names reach into nested
objects; a list gives its first element, as Caddy's header lists do).

    JsonFormat.detect('{"ts": 1700000000.5, "request": {"method": "GET", "uri": "/"}, "status": 200}')
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from crawlergate.errors import ConfigError
from crawlergate.tools.logrecord import FieldRow, LogRecord, blank_lines, parse_iso_time, split_request
from crawlergate.tools.logtext import parse_log_time

# Names per field, in the order they are tried. Caddy: request.* and ts/duration/size/status;
# nginx: its variable names; Traefik: its CamelCase names with request_<Header> for headers.
FIELD_NAMES: dict[str, tuple[str, ...]] = {
    "time": ("ts", "time_iso8601", "StartUTC", "@timestamp", "timestamp", "time", "StartLocal", "time_local", "msec"),
    "request": ("request",),  # a whole request line, nginx's $request
    "method": ("request.method", "request_method", "method", "RequestMethod", "verb"),
    "target": ("request.uri", "request_uri", "uri", "RequestPath", "path", "url"),
    "status": ("status", "DownstreamStatus", "status_code", "response.status", "OriginStatus"),
    "bytes": ("size", "body_bytes_sent", "bytes_sent", "DownstreamContentSize", "bytes", "response.size"),
    "user_agent": (
        "request.headers.User-Agent",
        "http_user_agent",
        "user_agent",
        "request_User-Agent",
        "userAgent",
        "user-agent",
    ),
    "referer": ("request.headers.Referer", "http_referer", "referer", "request_Referer", "referrer"),
    "host": ("request.client_ip", "request.remote_ip", "remote_addr", "ClientHost", "client_ip", "remote_ip", "ip"),
    "duration": ("duration", "request_time", "Duration", "upstream_response_time", "time_taken"),
    "user": ("user_id", "remote_user", "ClientUsername"),
}
# Traefik writes Duration in nanoseconds; every other server here writes seconds.
_NANOSECOND_DURATIONS = frozenset({"Duration"})
_MAPPING = re.compile(r"[a-z_]+=[^,=]+")


class JsonFormat:
    """A JSON-lines access log whose field names were chosen from a sample request (or given)."""

    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = dict(names)
        self._paths = {field: tuple(name.split(".")) for field, name in self.names.items()}
        missing = {"time", "status"} - set(self.names)
        if missing or not ({"request"} <= set(self.names) or {"method", "target"} <= set(self.names)):
            wanted = ", ".join(sorted(missing)) or "a request line or a method and a target"
            raise ConfigError(f"A JSON log format needs {wanted}; map them, e.g. --format 'json:time=@timestamp'.")
        self.spec = "json:" + ",".join(f"{field}={name}" for field, name in sorted(self.names.items()))
        self.has_duration = "duration" in self.names
        self.has_user_agent = "user_agent" in self.names
        self.flavour = _flavour(self.names)
        self.description = f"JSON lines ({self.flavour}, {len(self.names)} fields known)"

    @classmethod
    def from_spec(cls, spec: str, sample: str | None = None) -> JsonFormat:
        """``json`` (names from ``sample``) or ``json:field=name,...`` (given names, the rest from ``sample``)."""
        given: dict[str, str] = {}
        for item in filter(None, spec.removeprefix("json").removeprefix(":").split(",")):
            if not _MAPPING.fullmatch(item) or item.partition("=")[0] not in FIELD_NAMES:
                raise ConfigError(
                    f"JSON field mapping {item!r} is not FIELD=NAME with FIELD one of {', '.join(FIELD_NAMES)}."
                )
            field, _, name = item.partition("=")
            given[field] = name
        found = cls._names_in(sample) if sample is not None else {}
        return cls({**found, **given})

    @classmethod
    def detect(cls, line: str) -> JsonFormat | None:
        """The format of a sample line, or None when it is no JSON object with a time, a status and a request."""
        try:
            return cls(cls._names_in(line))
        except ConfigError:
            return None

    @staticmethod
    def _names_in(line: str) -> dict[str, str]:
        try:
            data = json.loads(line)
        except ValueError:
            return {}
        if not isinstance(data, dict):
            return {}
        names = {}
        for field, candidates in FIELD_NAMES.items():
            for name in candidates:
                value = _lookup(data, tuple(name.split(".")))
                if value is not None and (field != "request" or isinstance(value, str)):
                    names[field] = name
                    break
        return names

    def parse(self, line: str) -> LogRecord | None:
        values = self._values(line)
        if values is None:
            return None
        method, target, status, size, agent, when, data = values
        timestamp = _timestamp(when)
        if timestamp is None:
            return None
        return LogRecord(
            host=_text(self._get(data, "host")) or "-",
            timestamp=timestamp,
            method=method,
            target=target,
            status=int(status),
            bytes_sent=int(size) if size.isdigit() else 0,
            referer=_text(self._get(data, "referer")),
            user_agent=agent,
            duration_s=self._duration(data),
            user=_text(self._get(data, "user")).strip("-"),
        )

    def field_rows(self, text: str) -> list[FieldRow]:
        rows = []
        for line in text.splitlines():
            values = self._values(line)
            if values is not None:
                method, target, status, size, agent, when, _ = values
                rows.append((f"{method} {target}", status, size, agent, when))
        return rows

    def day_of(self, when: str) -> int | None:
        stamp = _timestamp(when)
        return None if stamp is None else int(stamp // 86_400)

    def ignored_lines(self, text: str) -> int:
        return blank_lines(text)

    def _values(self, line: str) -> tuple[str, str, str, str, str, str, dict[str, Any]] | None:
        line = line.lstrip("\ufeff")
        if not line.startswith("{"):
            return None
        try:
            data = json.loads(line)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        request = self._get(data, "request")
        if isinstance(request, str):
            split = split_request(request)
            if split is None:
                return None
            method, target = split
        else:
            method, target = _text(self._get(data, "method")), _text(self._get(data, "target"))
            if not method or not target:
                return None
        status = _text(self._get(data, "status"))
        if not status.isdigit():
            return None
        when = _text(self._get(data, "time"))
        return method, target, status, _text(self._get(data, "bytes")), _text(self._get(data, "user_agent")), when, data

    def _get(self, data: dict[str, Any], field: str) -> Any:
        path = self._paths.get(field)
        return _lookup(data, path) if path is not None else None

    def _duration(self, data: dict[str, Any]) -> float | None:
        value = self._get(data, "duration")
        if isinstance(value, str) and value[-1:].isalpha():
            return go_duration(value)  # Caddy's duration_format "string": "3.000000ms", "1m2.5s"
        try:
            seconds = float(_text(value))
        except ValueError:
            return None
        if self.names.get("duration") in _NANOSECOND_DURATIONS:
            return seconds / 1e9
        if type(value) is int and value >= 1000 and self.flavour == "Caddy":
            # Caddy's duration_format "nano": an integer of nanoseconds (its seconds are a float, and a
            # request of 1,000 s or more is not a page view).
            return seconds / 1e9
        return seconds


# A Go duration's parts (time.Duration.String): "1h2m3.5s", "850µs", "3.000000ms".
_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(text: str) -> float | None:
    """A Go duration string in seconds, or None when it is not one."""
    parts = _GO_DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _GO_UNIT_SECONDS[unit] for number, unit in parts)


def _flavour(names: Mapping[str, str]) -> str:
    if names.get("target") == "request.uri":
        return "Caddy"
    if names.get("target") == "RequestPath":
        return "Traefik"
    return "nginx-style names" if "request" in names or "request_uri" in names.values() else "field names mapped"


def _lookup(data: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    if isinstance(data, list):
        return data[0] if data else None
    return data


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e18 else repr(value)
    return value if isinstance(value, str) else str(value)


def _timestamp(when: str) -> float | None:
    """Seconds since the epoch from a number (seconds, milliseconds or microseconds) or a written time."""
    if not when or when == "-":
        return None
    try:
        number = float(when)
    except ValueError:
        if "/" in when[:6]:
            return parse_log_time(when)  # nginx $time_local
        if "/" in when[:8]:  # Caddy's time_format wall: 2024/03/10 00:00:09.123, local time taken as UTC
            return parse_iso_time(when.replace("/", "-", 2))
        return parse_iso_time(when)
    while number > 1e11:  # milliseconds, microseconds or nanoseconds since the epoch
        number /= 1000
    return number
