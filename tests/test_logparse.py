"""Reading a combined access log: lines parsed, malformed ones counted and skipped, gzip read by its content and
kept up to the damage, and progress reported while streaming."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from crawlergate.errors import ConfigError
from crawlergate.tools import logparse
from crawlergate.tools.logparse import LogFormat, LogReader, LogRecord, iter_records
from tests.conftest import DATA
from tests.visitors import GOOGLEBOT_UA

LOGS = DATA / "logs"

LINES = [
    pytest.param(
        '1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET /a?b=1 HTTP/1.0" 200 2326 "http://r/" "UA x" 1500',
        "auto",
        LogRecord("1.2.3.4", 971211336.0, "GET", "/a?b=1", 200, 2326, "http://r/", "UA x", 0.0015),
        id="auto-integer-is-microseconds",
    ),
    pytest.param(
        '1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "HEAD / HTTP/1.1" 404 - "-" "-" 0.250',
        "auto",
        LogRecord("1.2.3.4", 971186136.0, "HEAD", "/", 404, 0, "", "", 0.25),
        id="auto-decimal-is-seconds",
    ),
    pytest.param(
        '1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET / HTTP/1.1" 200 5 "-" "Agent \\"quoted\\""',
        "combined",
        LogRecord("1.2.3.4", 971186136.0, "GET", "/", 200, 5, "", 'Agent "quoted"', None),
        id="combined-escaped-quote",
    ),
    pytest.param(
        '1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET / HTTP/1.1" 200 5 "-" "UA" 3',
        "combined-seconds",
        LogRecord("1.2.3.4", 971186136.0, "GET", "/", 200, 5, "", "UA", 3.0),
        id="apache-percent-T",
    ),
    pytest.param(
        '1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET / HTTP/1.1" 200 5 "-" "UA" 250000',
        "combined-micros",
        LogRecord("1.2.3.4", 971186136.0, "GET", "/", 200, 5, "", "UA", 0.25),
        id="apache-percent-D",
    ),
    pytest.param(
        '1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET /x HTTP/1.1" 200 5 "-" "UA" 0.004',
        "nginx-timed",
        LogRecord("1.2.3.4", 971186136.0, "GET", "/x", 200, 5, "", "UA", 0.004),
        id="nginx-request-time",
    ),
    pytest.param(
        '1.2.3.4 [10/Oct/2000:13:55:36 +0000] "GET /custom HTTP/1.1" 200 77',
        '%h %t "%r" %>s %b',
        LogRecord("1.2.3.4", 971186136.0, "GET", "/custom", 200, 77, "", "", None),
        id="custom-format",
    ),
    pytest.param(
        '1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET /odd path HTTP/1.1" 200 1 "-" "UA"',
        "combined",
        LogRecord("1.2.3.4", 971186136.0, "GET", "/odd path", 200, 1, "", "UA", None),
        id="space-in-target",
    ),
]


@pytest.mark.parametrize(("line", "spec", "record"), LINES)
def test_logparse_parse_line(line: str, spec: str, record: LogRecord) -> None:
    assert LogFormat(spec).parse(line) == record


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("", id="empty"),
        pytest.param("garbage", id="garbage"),
        pytest.param('1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET / HTTP/1.1" 200 5 "-" "trunc', id="truncated"),
        pytest.param('1.2.3.4 - - [99/Foo/2000:13:55:36 +0000] "GET / HTTP/1.1" 200 5 "-" "UA"', id="bad-date"),
    ],
)
def test_logparse_malformed_line_is_none(line: str) -> None:
    assert LogFormat("auto").parse(line) is None


def test_logparse_reader_counts_and_skips_malformed(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    good = (LOGS / "combined-micros.log").read_text()
    path.write_text(good + "this is not a log line\n\n" + good.splitlines()[0][:60])
    reader = LogReader(path)
    records = list(reader)
    assert len(records) == 3
    assert reader.malformed == 2
    assert reader.format.has_duration


def test_logparse_reads_gzip_by_content(tmp_path: Path) -> None:
    path = tmp_path / "access.log.1"  # no .gz suffix: detected from the magic bytes
    path.write_bytes(gzip.compress((LOGS / "nginx-timed.log").read_bytes()))
    records = list(iter_records(path, "nginx-timed"))
    assert [record.target for record in records] == ["/t/42?page=2", "/t/42/reply"]
    assert records[0].path == "/t/42"


def test_logparse_truncated_gzip_keeps_what_was_read(tmp_path: Path) -> None:
    data = gzip.compress((LOGS / "combined-micros.log").read_bytes() * 200)
    path = tmp_path / "cut.log.gz"
    path.write_bytes(data[: len(data) // 2])
    reader = LogReader(path)
    records = list(reader)
    assert 0 < len(records) < 600
    assert reader.truncated


def test_logparse_gzip_cut_before_its_first_line_is_called_damaged_not_empty(tmp_path: Path) -> None:
    path = tmp_path / "cut.log.gz"
    path.write_bytes(gzip.compress((LOGS / "combined-micros.log").read_bytes() * 200)[:12])
    with pytest.raises(ConfigError, match="gzip stream is damaged before the first line"):
        _ = LogReader(path).format


def test_logparse_detects_the_format_past_a_first_line_too_long_to_be_a_request(tmp_path: Path) -> None:
    # A crash can leave a run of NULs without a newline at the start of a log.
    path = tmp_path / "access.log"
    path.write_bytes(b"\0" * 3_000_000 + b"\n" + (LOGS / "combined-micros.log").read_bytes())
    reader = LogReader(path)
    assert len(list(reader)) == 3
    assert reader.malformed == 1


def test_logparse_a_file_of_no_lines_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logparse, "SAMPLE_SCAN_BYTES", 1_000_000)
    path = tmp_path / "blob.log"
    path.write_bytes(b"\0" * 2_000_000)
    with pytest.raises(ConfigError, match="no line in its first 1,0[0-9,]+ bytes is shorter than 64 KB"):
        _ = LogReader(path).format


def test_logparse_streams_and_reports_progress(tmp_path: Path) -> None:
    line = (LOGS / "combined.log").read_text().splitlines()[0] + "\n"
    path = tmp_path / "big.log"
    path.write_text(line * 140_000)
    seen: list[tuple[int, int]] = []
    reader = LogReader(path, on_progress=lambda done, total: seen.append((done, total)))
    assert sum(1 for _ in reader) == 140_000
    assert seen[-1] == (path.stat().st_size, path.stat().st_size)
    assert len(seen) >= 3


def test_logparse_missing_user_agent_dash_is_empty() -> None:
    records = list(iter_records(LOGS / "combined.log"))
    assert records[1].user_agent == ""
    assert records[1].duration_s is None


def test_logparse_format_without_request_is_refused() -> None:
    with pytest.raises(ConfigError, match="no request field"):
        LogFormat("%h %t")


def test_logparse_a_misspelt_preset_is_named_as_such() -> None:
    with pytest.raises(ConfigError, match="neither a preset .*nginx-timed.* nor an Apache LogFormat"):
        LogFormat("nginx_timed")


def test_logparse_a_logformat_copied_from_httpd_conf_keeps_its_escaped_quotes_working() -> None:
    """httpd.conf writes the quotes of a LogFormat as \\" inside its own quotes, and Apache reads them as "."""
    copied = LogFormat(r"%h %l %u %t \"%r\" %>s %b \"%{Referer}i\" \"%{User-agent}i\" %D")
    line = f'192.0.2.7 - - [27/Nov/2026:10:00:00 +0000] "GET /t/1 HTTP/1.1" 200 5 "-" "{GOOGLEBOT_UA}" 412'
    record = copied.parse(line)
    assert record is not None and record.path == "/t/1" and record.user_agent == GOOGLEBOT_UA


def test_logparse_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        list(LogReader(tmp_path / "missing.log"))


@pytest.mark.parametrize(
    "request_field",
    [
        pytest.param('""', id="empty"),
        pytest.param('"-"', id="dash"),
        pytest.param(r'"\x16\x03\x01\x00"', id="tls-probe"),
    ],
)
def test_logparse_no_request_is_read_as_no_page_not_malformed(request_field: str) -> None:
    record = LogFormat("auto").parse(f'1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] {request_field} 400 5 "-" "UA"')
    assert record is not None and (record.method, record.target, record.status) == ("", "", 400)


def test_logparse_nginx_hex_escapes_are_undone() -> None:
    line = r'1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET /caf\xC3\xA9?q=\x22a\x22 HTTP/1.1" 200 5 "-" "UA \x22x\x22"'
    record = LogFormat("combined").parse(line)
    assert record is not None and record.target == '/café?q="a"' and record.user_agent == 'UA "x"'


NGINX_TIMES = (
    '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent"'
)


@pytest.mark.parametrize(
    ("fields", "values", "seconds"),
    [
        # $request_time is the whole request's, whatever the upstream tries after it say.
        (" $request_time $upstream_response_time", " 2.500 0.001, 2.499", 2.5),
        # Without it, the tries (", " between servers, " : " after an internal redirect) add up.
        (" $upstream_response_time", " 0.001, 2.499 : 1.000", 3.5),
        (" $upstream_response_time", " -", None),
    ],
)
def test_logparse_nginx_request_and_upstream_times(fields: str, values: str, seconds: float | None) -> None:
    record = LogFormat(NGINX_TIMES + fields).parse(_line_head() + values)
    assert record is not None and record.duration_s == seconds


@pytest.mark.parametrize(("directive", "seconds"), [("%{ms}T", 2.5), ("%{us}T", 0.0025), ("%{s}T", 2500.0)])
def test_logparse_apache_time_units(directive: str, seconds: float) -> None:
    record = LogFormat('%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i" ' + directive).parse(
        _line_head() + " 2500"
    )
    assert record is not None and record.duration_s == seconds


def _line_head() -> str:
    """A line's fields up to the user agent, which the time fields follow."""
    return '203.0.113.7 - - [11/Mar/2025:00:00:00 +0000] "GET /t/1 HTTP/1.1" 200 800 "-" "Googlebot/2.1"'
