"""Apache and nginx text logs: the combined and common formats, their presets, and any LogFormat string.

Real servers append fields to the combined format: nginx's ``$http_x_forwarded_for``,
``$request_time`` and ``$upstream_response_time``, Apache's ``%D`` or ``%T``, a ``host:port`` vhost
prefix (Apache's ``vhost_combined``). A detected layout takes any number of trailing fields, and
reads the response time from the one the detector found to hold it.

    LogFormat("combined").parse('1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.0" 200 5 "-" "UA"')
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from crawlergate.errors import ConfigError
from crawlergate.tools.logrecord import FieldRow, LogRecord, blank_lines, parse_iso_time, split_request

# LogFormat strings of the presets. The trailing time field is Apache's %D (microseconds) or %T
# (seconds), or nginx's $request_time (seconds, millisecond resolution).
PRESETS: dict[str, str] = {
    "combined": '%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-agent}i"',
    "combined-micros": '%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-agent}i" %D',
    "combined-seconds": '%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-agent}i" %T',
    # crawlergate serve's access log: combined, the TTFB in microseconds, the X-Crawlergate outcome.
    "crawlergate": '%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-agent}i" %D %{X-Crawlergate}o',
    "nginx": '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
    '"$http_referer" "$http_user_agent"',
    "nginx-timed": '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
    '"$http_referer" "$http_user_agent" $request_time',
    "common": '%h %l %u %t "%r" %>s %b',
    "vhost_combined": '%v %h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-agent}i"',
}

# "auto": combined, with an optional trailing number: a decimal point means seconds (nginx
# $request_time), an integer means microseconds (Apache %D, the field the paper's timings used).
AUTO = "auto"

# "Unrolling the loop" (Friedl): no alternation per character, ~5x faster than (?:[^"\\]|\\.)*.
_QUOTED = r'"([^"\\]*(?:\\.[^"\\]*)*)"'
_ADDRESSES = r"(\S+(?:, \S+)*)"
# Between the items of an nginx list variable: ", " between upstream servers, " : " after an internal redirect.
_LIST_SEPARATOR = r"(?:, | : )"
_UPSTREAM_TIMES = rf"((?:\d+(?:\.\d+)?|-)(?:{_LIST_SEPARATOR}(?:\d+(?:\.\d+)?|-))*)"
_FIELDS: dict[str, tuple[str, str | None]] = {
    # directive: (regex, record field)
    # A client address field may hold an X-Forwarded-For list ("203.0.113.5, 10.0.0.2").
    "%h": (_ADDRESSES, "host"),
    "%v": (r"\S+", None),
    "$remote_addr": (_ADDRESSES, "host"),
    "$http_x_forwarded_for": (_ADDRESSES, "host"),
    "%{X-Forwarded-For}i": (_ADDRESSES, "host"),
    "%a": (r"(\S+)", "host"),
    "%l": (r"\S+", None),
    "%u": (r"(\S+)", "user"),
    "$remote_user": (r"(\S+)", "user"),
    "%t": (r"\[([^\]]+)\]", "time"),
    "[$time_local]": (r"\[([^\]]+)\]", "time"),
    "[$time_iso8601]": (r"\[([^\]]+)\]", "time"),
    "$time_iso8601": (r"(\S+)", "time"),
    "$time_local": (r"(\S+ [+-]\d{4})", "time"),
    "$msec": (r"(\d+(?:\.\d+)?)", "time"),
    '"%r"': (_QUOTED, "request"),
    '"$request"': (_QUOTED, "request"),
    "%>s": (r"(\d{3})", "status"),
    "%s": (r"(\d{3})", "status"),
    "$status": (r"(\d{3})", "status"),
    "%b": (r"(\d+|-)", "bytes"),
    "%B": (r"(\d+)", "bytes"),
    "$body_bytes_sent": (r"(\d+|-)", "bytes"),
    "$bytes_sent": (r"(\d+|-)", "bytes"),
    '"%{Referer}i"': (_QUOTED, "referer"),
    '"$http_referer"': (_QUOTED, "referer"),
    '"%{User-agent}i"': (_QUOTED, "user_agent"),
    '"%{User-Agent}i"': (_QUOTED, "user_agent"),
    '"$http_user_agent"': (_QUOTED, "user_agent"),
    "%D": (r"(\d+)", "micros"),
    "%T": (r"(\d+)", "seconds"),
    "%{s}T": (r"(\d+)", "seconds"),
    "%{ms}T": (r"(\d+)", "millis"),
    "%{us}T": (r"(\d+)", "micros"),
    "$request_time": (r"(\d+(?:\.\d+)?)", "seconds"),
    # One time per upstream tried ("0.002, 0.072"), groups of them after internal redirects ("0.001 : 2.499"):
    # their sum is the origin's time, read when the format has no $request_time.
    "$upstream_response_time": (_UPSTREAM_TIMES, "upstream_seconds"),
}
_DIRECTIVE = re.compile(r'"[%$][^"]+"|\[\$time_(?:local|iso8601)\]|%>s|%\{[^}]+\}[ioeT]|%[a-zA-Z]|\$[a-z_0-9]+')
_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTHS = {name: number for number, name in enumerate(_MONTH_NAMES, start=1)}
# Trailing fields after the last known one: anything up to the end of the line.
_TAIL = r"((?: [^\n]*)?)"
_HEX_ESCAPES = re.compile(r"(?:\\x[0-9A-Fa-f]{2})+")
_TAIL_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(\S+)')
# A response time as servers write it: 0.004 (nginx), 1500 (Apache %D), rt=0.004 (labelled nginx formats).
_TIME_VALUE = re.compile(r"(?:[A-Za-z_]+[=:])?(\d+(?:\.\d+)?)")
_LAYOUT_SPEC = re.compile(r"text:(combined|common)(,vhost)?,extra=(\d+)(?:,duration=(\d+)(s|ms|us))?")


@dataclass(frozen=True, slots=True)
class TextLayout:
    """What the detector found in a text log: the base format, a vhost prefix, the trailing fields."""

    base: str  # "combined" or "common"
    vhost: bool
    extra_fields: int
    # Which trailing field holds the response time, and in which unit ("s" or "us"), if any does.
    duration_field: int | None = None
    duration_unit: str = "s"

    @property
    def spec(self) -> str:
        duration = f",duration={self.duration_field}{self.duration_unit}" if self.duration_field is not None else ""
        return f"text:{self.base}{',vhost' if self.vhost else ''},extra={self.extra_fields}{duration}"

    @classmethod
    def from_spec(cls, spec: str) -> TextLayout | None:
        match = _LAYOUT_SPEC.fullmatch(spec)
        if match is None:
            return None
        base, vhost, extra, field, unit = match.groups()
        return cls(base, bool(vhost), int(extra), int(field) if field else None, unit or "s")

    @property
    def description(self) -> str:
        name = ("vhost_" if self.vhost else "") + self.base
        text = f"nginx/Apache {name}"
        if self.extra_fields:
            text += f" + {self.extra_fields} extra field{'s' if self.extra_fields > 1 else ''}"
        if self.duration_field is not None:
            unit = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}[self.duration_unit]
            text += f" (response time in extra field {self.duration_field + 1}, {unit})"
        else:
            text += " (no response-time field)"
        return text


class LogFormat:
    """A compiled text log format: a preset name, ``auto``, a detected layout's spec, or a LogFormat string.

    ``auto`` is combined with any trailing fields, the first number among them read as the response
    time (a decimal point: seconds, as nginx's $request_time; an integer: microseconds, as Apache's %D).
    """

    def __init__(self, spec: str = AUTO) -> None:
        self.spec = self.name = spec
        layout = TextLayout.from_spec(spec)
        self._layout = layout
        if layout is not None:
            text = ("%v " if layout.vhost else "") + PRESETS[layout.base]
            self.description = layout.description
        else:
            text = PRESETS["combined"] if spec == AUTO else PRESETS.get(spec, spec)
            if "%" not in text and "$" not in text:
                raise ConfigError(
                    f"Log format {spec!r} is neither a preset ({', '.join(PRESETS)}, json, w3c, auto) nor an "
                    "Apache LogFormat or nginx log_format string."
                )
            # A LogFormat copied from httpd.conf keeps its escaped quotes: Apache reads \" as ".
            text = text.replace('\\"', '"')
            self.description = "nginx/Apache combined + any extra fields" if spec == AUTO else f"log format {spec!r}"
        tail = _TAIL if spec == AUTO or layout is not None else ""
        self._pattern, self._fields = _compile_format(text, tail)
        if tail:
            self._fields.append("tail")
        self.has_user_agent = "user_agent" in self._fields
        self.has_duration = any(f in {"micros", "seconds"} for f in self._fields) or (
            spec == AUTO or (layout is not None and layout.duration_field is not None)
        )
        # The same format for whole blocks of lines: anchored at each line, never crossing one.
        self._block_pattern = re.compile(
            "^" + self._pattern.pattern.removesuffix(_LINE_END) + r"[ \t\r]*$", re.MULTILINE
        )
        position = {name: index for index, name in reversed(list(enumerate(self._fields)))}
        self._request = position["request"]
        self._status, self._bytes = position.get("status"), position.get("bytes")
        self._user_agent, self._time = position.get("user_agent"), position.get("time")
        wanted = (self._request, self._status, self._bytes, self._user_agent, self._time)
        # match.group(i, j, ...) cuts all fields out in one C call when the format has them all.
        self._fast_indices = tuple(index + 1 for index in wanted) if None not in wanted else ()  # type: ignore[operator]

    def parse(self, line: str) -> LogRecord | None:
        """The record of one line, or None when the line does not match the format."""
        match = self._pattern.match(line)
        if match is None:
            return None
        values = dict(zip(self._fields, match.groups(), strict=True))
        # A line the server wrote for something that was no request (a TLS probe, "-" on a 400 or 408) is
        # read, as no page: it is a line of the format, not a malformed one.
        method, target = split_request(_unescape(values.get("request") or "")) or ("", "")
        timestamp = any_log_time(values["time"]) if "time" in values else 0.0
        if timestamp is None:
            return None
        size = values.get("bytes")
        return LogRecord(
            host=values.get("host", "-"),
            timestamp=timestamp,
            method=method,
            target=target,
            status=int(values.get("status") or 0),
            bytes_sent=int(size) if size and size != "-" else 0,
            referer=_unescape(values.get("referer", "")),
            user_agent=_unescape(values.get("user_agent", "")),
            duration_s=self._duration(values),
            user=_unescape(values.get("user", "")),
        )

    def day_of(self, when: str) -> int | None:
        # Only the date ("10/Oct/2000") decides the day; noon keeps any zone offset within it.
        stamp = _date_stamp(when[:11]) if "/" in when[:6] else any_log_time(when)
        return None if stamp is None else int(stamp // 86_400)

    def ignored_lines(self, text: str) -> int:
        return blank_lines(text)

    def _duration(self, values: dict[str, str]) -> float | None:
        if "micros" in values:
            return int(values["micros"]) / 1_000_000
        if "millis" in values:
            return int(values["millis"]) / 1_000
        seconds = values.get("seconds")
        if seconds is not None and seconds != "-":
            return float(seconds)
        upstream = values.get("upstream_seconds")
        if upstream is not None:
            tries = [float(time) for time in re.split(_LIST_SEPARATOR, upstream) if time != "-"]
            return sum(tries) if tries else None
        tail = values.get("tail")
        if not tail:
            return None
        tokens = tail_tokens(tail)
        layout = self._layout
        if layout is None:  # auto: the first bare number
            for token, quoted in tokens:
                if not quoted and _TIME_VALUE.fullmatch(token):
                    return _seconds(token, "s" if "." in token else "us")
            return None
        if layout.duration_field is None or layout.duration_field >= len(tokens):
            return None
        return _seconds(tokens[layout.duration_field][0], layout.duration_unit)

    def tail_of(self, line: str) -> str | None:
        """The trailing fields of a line that matches (for the detector), or None when it does not match."""
        match = self._pattern.match(line)
        if match is None or "tail" not in self._fields:
            return None if match is None else ""
        return str(match.group(len(self._fields)))

    def field_rows(self, text: str) -> list[FieldRow]:
        """(request line, status, bytes, user agent, time) of every well-formed line of ``text``, as text.

        The fast path for tools that read millions of lines and need only these (``simulate``): one
        regex scan over a whole block of lines, the fields cut out in C, no object per line. Fields the
        format lacks are "". Lines that do not match are left out; the caller counts them. User agents
        keep their escapes (``\\"``); split the request line with ``split_request``.
        """
        indices = self._fast_indices
        if indices:
            return [match.group(*indices) for match in self._block_pattern.finditer(text)]  # type: ignore[misc]
        return [self._slow_fields(match) for match in self._block_pattern.finditer(text)]

    def _slow_fields(self, match: re.Match[str]) -> FieldRow:
        groups = match.groups()
        return tuple(  # type: ignore[return-value]
            (groups[index] or "") if index is not None else ""
            for index in (self._request, self._status, self._bytes, self._user_agent, self._time)
        )


_LINE_END = r"\s*$"


def _compile_format(text: str, tail: str = "") -> tuple[re.Pattern[str], list[str]]:
    fields: list[str] = []
    parts: list[str] = []
    position = 0
    for match in _DIRECTIVE.finditer(text):
        parts.append(re.escape(text[position : match.start()]))
        directive = match.group()
        if directive not in _FIELDS:
            quoted = directive.startswith('"')
            # An unknown variable may be empty ("[]") or a list ("a, b") in nginx logs.
            parts.append(_QUOTED if quoted else rf"(?:[^\s,\]]+(?:{_LIST_SEPARATOR}[^\s,\]]+)*)?")
            if quoted:
                fields.append("ignored")
        else:
            regex, name = _FIELDS[directive]
            parts.append(regex)
            if name is not None:
                fields.append(name)
        position = match.end()
    parts.append(re.escape(text[position:]))
    if "request" not in fields:
        raise ConfigError(f"Log format {text!r} has no request field (%r or $request); cannot read paths from it.")
    return re.compile("".join(parts) + tail + _LINE_END), fields


@functools.lru_cache(maxsize=4096)
def parse_log_time(text: str) -> float | None:
    """Apache/nginx time, e.g. ``10/Oct/2000:13:55:36 -0700``, to a Unix timestamp; memoised, as lines share seconds."""
    try:
        day, month, rest = text.split("/", 2)
        zone = rest[14:].strip() or "+0000"
        offset = (-1 if zone[0] == "-" else 1) * timedelta(hours=int(zone[1:3]), minutes=int(zone[3:5]))
        moment = datetime(
            int(rest[0:4]),
            _MONTHS[month],
            int(day),
            int(rest[5:7]),
            int(rest[8:10]),
            int(rest[11:13]),
            tzinfo=timezone(offset),
        )
    except (ValueError, KeyError, IndexError):
        return None
    return moment.timestamp()


def any_log_time(text: str) -> float | None:
    """A time as web servers write it: Apache/nginx ``10/Oct/2000:13:55:36 -0700``, ISO 8601, or epoch seconds."""
    if "/" in text[:6]:
        return parse_log_time(text)
    if text[:1].isdigit() and "-" not in text[:6]:
        try:
            return float(text)
        except ValueError:
            return None
    return parse_iso_time(text)


@functools.lru_cache(maxsize=1024)
def _date_stamp(date: str) -> float | None:
    return parse_log_time(date + ":12:00:00 +0000")


def _seconds(token: str, unit: str) -> float | None:
    match = _TIME_VALUE.fullmatch(token.removesuffix("ms") if unit == "ms" else token)
    if match is None:
        return None
    return float(match.group(1)) / {"s": 1, "ms": 1_000, "us": 1_000_000}[unit]


def tail_tokens(line_tail: str) -> list[tuple[str, bool]]:
    """The trailing fields of a line as (text, was quoted), for the detector."""
    return [(bare, False) if bare else (quoted, True) for quoted, bare in _TAIL_TOKEN.findall(line_tail)]


def time_value(token: str) -> str | None:
    """The number in a response-time field (``0.004``, ``1500``, ``rt=0.004``), or None."""
    match = _TIME_VALUE.fullmatch(token)
    return match.group(1) if match else None


def _unescape(text: str) -> str:
    """Apache's ``\\"`` and nginx's ``\\xHH`` escapes undone (nginx escapes '"' and bytes over 0x7E)."""
    if text == "-":
        return ""
    if "\\" not in text:
        return text
    text = _HEX_ESCAPES.sub(
        lambda match: bytes.fromhex(match.group().replace("\\x", "")).decode("utf-8", "replace"), text
    )
    return text.replace('\\"', '"').replace("\\\\", "\\")
