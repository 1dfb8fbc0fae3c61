"""Access-log files to LogRecords, in whatever common format the server wrote, detected from the first lines.

Formats read: Apache and nginx text logs (combined or common, with any trailing fields and an
optional vhost prefix; ``logtext``), JSON lines (Caddy, nginx, Traefik; ``logjson``) and W3C
extended logs (IIS, CloudFront; ``logw3c``), plain or gzipped. Streams: a multi-gigabyte log is
read line by line, never loaded whole. Lines that do not match are counted and skipped, one kept
as an example; a file in which no line reads as a request is refused with a sentence saying what
its first line looked like.

    reader = LogReader("access.log.gz")
    print("read as:", reader.format.description)
    for record in reader:
        ...
    reader.malformed  # how many lines were skipped
"""

from __future__ import annotations

import contextlib
import gzip
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from crawlergate.errors import ConfigError
from crawlergate.tools.logjson import JsonFormat
from crawlergate.tools.logrecord import AccessLogFormat, FieldRow, LogRecord, split_request
from crawlergate.tools.logtext import AUTO, PRESETS, LogFormat, TextLayout, parse_log_time, tail_tokens, time_value
from crawlergate.tools.logw3c import W3cFormat

__all__ = [
    "AUTO",
    "PRESETS",
    "AccessLogFormat",
    "FieldRow",
    "LogFormat",
    "LogReader",
    "LogRecord",
    "detect_format",
    "iter_records",
    "make_format",
    "parse_log_time",
    "split_request",
]

T = TypeVar("T")
# Lines are read in blocks of about this size for the fast path: big enough to amortise the regex
# call, small enough to keep memory flat.
BLOCK_BYTES = 4 * 1024 * 1024
# The detector reads at most this many lines from the start of a file, skipping any longer than
# SAMPLE_LINE_BYTES (a run of NULs a crash left, a binary blob), and gives up after SAMPLE_SCAN_BYTES.
SAMPLE_LINES = 200
SAMPLE_LINE_BYTES = 64 * 1024
SAMPLE_SCAN_BYTES = 64 * 1024 * 1024
# More malformed lines than this share earns a warning: a log of another layout, not a few bad lines.
MALFORMED_WARNING_SHARE = 0.05
# A response-time column is one that holds a number in at least this share of the sampled lines.
_DURATION_SHARE = 0.8
_MILLISECONDS = re.compile(r"\d+(?:\.\d+)?ms")
_GZIP_MAGIC = b"\x1f\x8b"
_OTHER_COMPRESSION = (
    (b"BZh", "bzip2", "bzip2"),
    (b"\xfd7zXZ\x00", "xz", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd"),
    (b"PK\x03\x04", "zip", "unzip -p"),
)
_FORMATS_READ = (
    "nginx/Apache combined or common (extra fields and a vhost prefix allowed), JSON lines (Caddy, nginx, "
    "Traefik), W3C extended (IIS, CloudFront)"
)


def make_format(spec: str, sample: list[str] | None = None) -> AccessLogFormat:
    """A format from ``--format``: ``auto`` (detected from ``sample``), ``json[:FIELD=NAME,...]``,
    ``w3c[:FIELDS]``, a preset name, a detected layout's spec, or an Apache LogFormat / nginx log_format string."""
    lines = sample or []
    if spec == AUTO:
        detected = detect_format(lines)
        if detected is None:
            raise ConfigError(_not_a_log(lines))
        return detected
    if spec == "json" or spec.startswith("json:"):
        first = next((line for line in lines if line.startswith("{")), None)
        return JsonFormat.from_spec(spec, first)
    if spec == "w3c":
        detected_w3c = W3cFormat.detect(lines)
        if detected_w3c is None:
            raise ConfigError("No '#Fields:' line at the start of the log: give them, --format 'w3c:date time ...'.")
        return detected_w3c
    if spec.startswith("w3c:"):
        return W3cFormat.from_spec(spec)
    return LogFormat(spec)


def detect_format(lines: list[str]) -> AccessLogFormat | None:
    """The format the sample lines are written in, or None when no line reads as a request in any."""
    lines = [line.rstrip("\r\n").lstrip("\ufeff") for line in lines if line.strip()]
    if not lines:
        return None
    if any(line.startswith("#") for line in lines[:10]):
        w3c = W3cFormat.detect(lines)
        if w3c is not None:
            return w3c
    # JSON lines, even when the first line is cut (a log read from the middle) or starts with a BOM.
    if sum(line.startswith("{") for line in lines[:10]) > len(lines[:10]) // 2:
        for line in lines[:10]:
            found = JsonFormat.detect(line)
            if found is not None:
                return found
        return None
    return _detect_text(lines)


def _detect_text(lines: list[str]) -> LogFormat | None:
    # Most specific first: a common layout with trailing fields also reads every combined line.
    matches: list[tuple[TextLayout, list[str]]] = []
    for base in ("combined", "common"):
        for vhost in (False, True):
            layout = TextLayout(base, vhost, 0)
            candidate = LogFormat(layout.spec)
            matches.append((layout, [tail for tail in map(candidate.tail_of, lines) if tail is not None]))
    most = max(len(tails) for _, tails in matches)
    if most == 0:
        return None
    layout, tails = next((layout, tails) for layout, tails in matches if len(tails) >= most / 2)
    rows = [tail_tokens(tail) for tail in tails]
    extra = max(len(row) for row in rows)
    field, unit = _duration_field(rows, extra)
    return LogFormat(TextLayout(layout.base, layout.vhost, extra, field, unit).spec)


def _duration_field(rows: list[list[tuple[str, bool]]], extra: int) -> tuple[int | None, str]:
    """Which trailing field holds the response time, and its unit; (None, "s") when the log does not say.

    A field of decimal numbers is seconds (nginx's $request_time), of ``57ms`` values milliseconds
    (Traefik); the first such field wins. Integers alone are ambiguous (byte counts, request
    lengths and counters are integers too), so they are read as Apache's %D, in microseconds, only
    when they are the one and only trailing field, as in Apache's ``combined`` + %D.
    """
    for position in range(extra):
        values = [row[position][0] for row in rows if position < len(row)]
        if len(values) < _DURATION_SHARE * len(rows):
            continue
        if sum(1 for value in values if _MILLISECONDS.fullmatch(value)) >= _DURATION_SHARE * len(rows):
            return position, "ms"
        numbers = [number for number in map(time_value, values) if number is not None]
        if len(numbers) >= _DURATION_SHARE * len(rows) and any("." in number for number in numbers):
            return position, "s"
    if extra == 1:
        only = [time_value(row[0][0]) for row in rows if row and not row[0][1]]
        if only and all(number is not None and "." not in number for number in only):
            return 0, "us"
    # crawlergate's own access log (and varnishncsa's like it): %D, then the X-Crawlergate outcome (and, since
    # issue 16, the verdict and its evidence, quoted).
    if extra in (2, 4) and all(
        len(row) == extra and row[0][0].isdigit() and row[1][0] in _GATE_OUTCOMES for row in rows
    ):
        return 0, "us"
    return None, "s"


# The X-Crawlergate outcomes (crawlergate.metrics.OUTCOMES) and "-" for an answer without one.
_GATE_OUTCOMES = frozenset(("l1-hit", "l2-hit", "miss", "stale", "pass", "error", "refused", "denied", "-"))


def _not_a_log(lines: list[str]) -> str:
    first = next((line.strip() for line in lines if line.strip()), "")
    shown = (first[:100] + "…") if len(first) > 100 else first
    looked = f"its first line is {shown!r}" if first else "it has no text line"
    return (
        f"no line reads as an access log ({looked}). Read are: {_FORMATS_READ}. For another layout give "
        "--format with its Apache LogFormat or nginx log_format string, e.g. --format '%h %l %u %t \"%r\" %>s %b'."
    )


class LogReader:
    """Iterates the records of a log file (plain or gzip, detected by content), counting malformed lines.

    Parameters:
        path: the log file.
        log_format: a format object, or a spec for ``make_format`` (``auto``, the default, detects it).
        on_progress: called now and then with (bytes read, total bytes) of the file on disk.
    """

    def __init__(
        self,
        path: str | Path,
        log_format: AccessLogFormat | str = AUTO,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._format = log_format if not isinstance(log_format, str) else None
        self._spec = log_format if isinstance(log_format, str) else log_format.spec
        self.lines = 0
        self.malformed = 0
        self.records = 0
        # The first malformed line: (line number, text).
        self.malformed_example: tuple[int, str] | None = None
        # Why reading stopped early (a damaged gzip file), or None.
        self.truncated: str | None = None
        self._on_progress = on_progress

    @property
    def format(self) -> AccessLogFormat:
        """The log's format, detected from the first lines of the file on first use."""
        if self._format is None:
            self._check_readable()
            sample = self._sample()
            try:
                self._format = make_format(self._spec, sample)
            except ConfigError as exc:
                if not sample:
                    raise ConfigError(f"Log file '{self.path}' is empty.") from None
                raise ConfigError(f"Log file '{self.path}': {exc}") from None
        return self._format

    def __iter__(self) -> Iterator[LogRecord]:
        return self._parsed(self.format.parse)

    def _check_readable(self) -> None:
        if self.path.exists() and not self.path.is_file():
            raise ConfigError(
                f"Log file '{self.path}' is no regular file (a pipe or a device): it is read twice, to detect its "
                "format and then to read it. Write it to a file first."
            )
        try:
            with self.path.open("rb") as handle:
                magic = handle.read(6)
        except OSError as exc:
            raise ConfigError(f"Log file '{self.path}' cannot be read: {exc.strerror}.") from None
        for signature, name, tool in _OTHER_COMPRESSION:
            if magic.startswith(signature):
                raise ConfigError(
                    f"Log file '{self.path}' is compressed with {name}, which is not read here (gzip is): "
                    f"decompress it first, e.g. {tool} -dc '{self.path}' > access.log."
                )

    def warnings(self) -> list[str]:
        """Sentences about what went wrong while reading, for the end of a command's output."""
        found = []
        if self.truncated:
            found.append(f"the log ends early: {self.truncated}")
        if self.lines and self.malformed > MALFORMED_WARNING_SHARE * self.lines:
            example = ""
            if self.malformed_example is not None:
                number, text = self.malformed_example
                example = f"; e.g. line {number:,}: {text[:120]!r}"
            found.append(
                f"{self.malformed:,} of {self.lines:,} lines ({self.malformed / self.lines:.1%}) did not read as "
                f"{self.format.description}{example}. Another --format may read them."
            )
        return found

    def require_requests(self) -> None:
        """Raise ConfigError when the whole file gave not one request (a log of another layout)."""
        if self.records == 0 and self.truncated is None:
            example = ""
            if self.malformed_example is not None:
                example = f" (line {self.malformed_example[0]:,}: {self.malformed_example[1][:100]!r})"
            raise ConfigError(
                f"Log file '{self.path}': none of its {self.lines:,} lines read as {self.format.description}"
                f"{example}. Try --format auto, or the server's LogFormat string."
            )

    def field_rows(self, start: int = 0, end: int | None = None) -> Iterator[list[FieldRow]]:
        """The log as lists of ``field_rows`` tuples of its format, one list per block of lines.

        ``start``/``end`` read only the lines that begin within those byte offsets of a plain
        (not gzipped) file, so several processes can share one log.
        """
        log_format = self.format
        for block in self._blocks(start, end):
            rows = log_format.field_rows(block)
            lines = block.count("\n") + (not block.endswith("\n"))
            bad = lines - len(rows) - log_format.ignored_lines(block)
            if bad > 0:
                self.malformed += bad
                if self.malformed_example is None:
                    self._find_example(block, self.lines)
            self.lines += lines
            self.records += len(rows)
            yield rows

    def _find_example(self, block: str, lines_before: int) -> None:
        for number, line in enumerate(block.splitlines(), start=lines_before + 1):
            if line.strip() and not line.startswith("#") and self.format.parse(line) is None:
                self.malformed_example = (number, line)
                return

    def _sample(self) -> list[str]:
        """The first lines of the log (decompressed), for the detector; a line too long to be a request's skipped."""
        lines: list[str] = []
        scanned = 0
        damage: str | None = None
        try:
            with self._open() as (_, stream, _total):
                long_line = False  # reading the rest of a line too long to be a request's
                while len(lines) < SAMPLE_LINES and scanned < SAMPLE_SCAN_BYTES:
                    line = stream.readline(SAMPLE_LINE_BYTES)
                    if not line:
                        break
                    scanned += len(line)
                    whole = line.endswith(b"\n") or len(line) < SAMPLE_LINE_BYTES
                    if whole and not long_line:
                        lines.append(line.decode("utf-8", "replace"))
                    long_line = not whole
        except (EOFError, gzip.BadGzipFile, OSError, zlib.error) as exc:
            damage = str(exc) or type(exc).__name__  # a damaged stream still gives what came before the damage
        if not lines and damage:
            raise ConfigError(f"Log file '{self.path}': its gzip stream is damaged before the first line ({damage}).")
        if not lines and scanned:
            raise ConfigError(
                f"Log file '{self.path}': no line in its first {scanned:,} bytes is shorter than "
                f"{SAMPLE_LINE_BYTES // 1024} KB, as a request's line would be."
            )
        return lines

    def _blocks(self, start: int = 0, end: int | None = None) -> Iterator[str]:
        """The log as text blocks of whole lines (about 4 MB each)."""
        with self._open() as (raw, stream, total):
            if start or end is not None:
                if stream is not raw:
                    raise ConfigError(f"Log file '{self.path}' is compressed; it cannot be read in parts.")
                yield from self._range_blocks(raw, start, total if end is None else end)
                return
            rest = b""
            try:
                while chunk := _read_block(stream):
                    head, newline, tail = chunk.rpartition(b"\n")
                    if newline:
                        yield (rest + head + newline).decode("utf-8", "replace")
                        rest = tail
                    else:
                        rest += tail
                    if self._on_progress is not None:
                        self._on_progress(raw.tell(), total)
            except (EOFError, gzip.BadGzipFile, OSError, zlib.error) as exc:
                self.malformed += 1
                self.truncated = str(exc) or type(exc).__name__
            if rest:
                yield rest.decode("utf-8", "replace")
            if self._on_progress is not None:
                self._on_progress(total, total)

    def _range_blocks(self, raw: BinaryIO, start: int, end: int) -> Iterator[str]:
        # A line belongs to the range its first byte is in.
        if start > 0:
            raw.seek(start - 1)
            if raw.read(1) != b"\n":
                raw.readline()
        position = raw.tell()
        rest = b""
        while position < end or rest:
            chunk = raw.read(BLOCK_BYTES) if position < end else b""
            offset, position = position, position + len(chunk)
            data = rest + chunk
            if position >= end or not chunk:
                cut = data.find(b"\n", max(0, end - 1 - (offset - len(rest))))
                data = data if cut < 0 else data[: cut + 1]
                if data:
                    yield data.decode("utf-8", "replace")
                return
            head, newline, rest = data.rpartition(b"\n")
            if newline:
                yield (head + newline).decode("utf-8", "replace")
            else:
                rest = data

    @contextlib.contextmanager
    def _open(self) -> Iterator[tuple[BinaryIO, BinaryIO, int]]:
        try:
            raw = self.path.open("rb")
        except OSError as exc:
            raise ConfigError(f"Log file '{self.path}' cannot be read: {exc.strerror}.") from None
        with raw:
            compressed = raw.read(2) == _GZIP_MAGIC
            raw.seek(0)
            stream: BinaryIO = gzip.GzipFile(fileobj=raw) if compressed else raw  # type: ignore[assignment]
            yield raw, stream, self.path.stat().st_size

    def _parsed(self, parse: Callable[[str], T | None]) -> Iterator[T]:
        with self._open() as (raw, stream, total):
            progress = self._on_progress
            try:
                for line in stream:
                    self.lines += 1
                    text = line.decode("utf-8", "replace").rstrip("\r\n")
                    record = parse(text)
                    if record is None:
                        if text.strip() and not text.startswith("#"):
                            self.malformed += 1
                            if self.malformed_example is None:
                                self.malformed_example = (self.lines, text)
                        continue
                    self.records += 1
                    if progress is not None and self.lines % 65536 == 0:
                        progress(raw.tell(), total)
                    yield record
            except (EOFError, gzip.BadGzipFile, OSError, zlib.error) as exc:
                # A truncated or corrupt gzip stream ends the log where it breaks, as zcat does.
                self.malformed += 1
                self.truncated = str(exc) or type(exc).__name__
            if progress is not None:
                progress(total, total)


def _read_block(stream: BinaryIO) -> bytes:
    """About BLOCK_BYTES of the stream, in the small reads ``read1`` makes: a damaged gzip stream raises
    only on the read that meets the damage, so everything before it is kept (``read(n)`` would lose a
    whole block)."""
    parts: list[bytes] = []
    size = 0
    while size < BLOCK_BYTES:
        try:
            chunk = stream.read1(BLOCK_BYTES - size)  # type: ignore[attr-defined]  # GzipFile and BufferedReader have it
        except (EOFError, gzip.BadGzipFile, OSError, zlib.error):
            if parts:
                break  # hand over what came before; the next call raises again and ends the log
            raise
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def iter_records(path: str | Path, log_format: AccessLogFormat | str = AUTO) -> Iterator[LogRecord]:
    """Records of a log file; see LogReader for the malformed-line count."""
    return iter(LogReader(path, log_format))
