"""Access logs as servers really write them (nginx, Apache, IIS, CloudFront, JSON…): each format detected and read
exactly, response times only where the log has them, and what is no log refused with the reason."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from crawlergate.cli import main
from crawlergate.errors import ConfigError
from crawlergate.tools.logparse import LogReader, detect_format, make_format
from crawlergate.tools.logrecord import LogRecord
from tests.conftest import DATA
from tests.visitors import BINGBOT_SHORT_UA, GOOGLEBOT_SHORT_UA, GOOGLEBOT_UA, YANDEXBOT_SHORT_UA

FORMATS = DATA / "logs" / "formats"

# Each file as a server writes it, what the detector must call it, and every request it holds.
# Times: 2024-01-15 10:00:01 UTC is 1705312801.
EXPECTED = [
    pytest.param(
        "nginx-xff.log",
        "nginx/Apache combined + 1 extra field (no response-time field)",
        [
            LogRecord(
                "203.0.113.9",
                1705309201.0,
                "GET",
                "/forum/t/1?page=2",
                200,
                5120,
                "https://example.org/",
                GOOGLEBOT_UA,
                None,
            ),  # noqa: E501
            LogRecord(
                "198.51.100.7",
                1705309202.0,
                "POST",
                "/forum/reply",
                302,
                0,
                "",
                'Mozilla/5.0 "quoted" Firefox/121.0',
                None,
                "alice",
            ),  # noqa: E501
            LogRecord("203.0.113.9", 1705309203.0, "GET", "/forum/t/2", 404, 153, "", "curl/8.5.0", None),
        ],
        1,
        id="nginx-combined-x-forwarded-for-blank-first-truncated-last",
    ),
    pytest.param(
        "nginx-timed-upstream.log",
        "nginx/Apache combined + 4 extra fields (response time in extra field 2, seconds)",
        [
            LogRecord("203.0.113.9", 1705312801.0, "GET", "/a", 200, 5120, "", BINGBOT_SHORT_UA, 0.123),
            LogRecord("203.0.113.9", 1705312802.0, "GET", "/b", 502, 157, "", BINGBOT_SHORT_UA, 30.001),
            LogRecord("203.0.113.9", 1705312803.0, "GET", "/static/x.css", 200, 800, "", BINGBOT_SHORT_UA, 0.0),
        ],
        0,
        id="nginx-request-time-and-upstream-times",
    ),
    pytest.param(
        "apache-micros.log",
        "nginx/Apache combined + 1 extra field (response time in extra field 1, microseconds)",
        [
            LogRecord(
                "192.0.2.10",
                1705381199.0,
                "GET",
                "/index.php?title=Main_Page",
                200,
                18234,
                "",
                "Mozilla/5.0 (X11; Linux x86_64) Firefox/121.0",
                0.152345,
            ),  # noqa: E501
            LogRecord("192.0.2.11", 1705381201.0, "HEAD", "/", 200, 0, "", "", 0.000842),
        ],
        0,
        id="apache-percent-D-across-midnight",
    ),
    pytest.param(
        "apache-vhost.log",
        "nginx/Apache vhost_combined (no response-time field)",
        [
            LogRecord("192.0.2.10", 1705312801.0, "GET", "/wiki/Start", 200, 9000, "", YANDEXBOT_SHORT_UA, None),
            LogRecord("192.0.2.11", 1705312802.0, "GET", "/", 301, 230, "", YANDEXBOT_SHORT_UA, None),
        ],
        0,
        id="apache-vhost-combined",
    ),
    pytest.param(
        "common.log",
        "nginx/Apache common (no response-time field)",
        [
            LogRecord("192.0.2.10", 1705312801.0, "GET", "/page", 200, 1234, "", "", None),
            LogRecord("192.0.2.10", 1705312802.0, "GET", "/apache_pb.gif", 200, 2326, "", "", None, "frank"),
        ],
        0,
        id="common",
    ),
    pytest.param(
        "caddy.json",
        "JSON lines (Caddy, 10 fields known)",
        [
            LogRecord(
                "203.0.113.9",
                1705312801.5241024,
                "GET",
                "/blog/post-1?ref=x",
                200,
                10900,
                "https://example.org/",
                "Mozilla/5.0 (compatible; GPTBot/1.0; +https://openai.com/gptbot)",
                0.000929675,
            ),  # noqa: E501
            LogRecord(
                "198.51.100.7", 1705312802.0, "POST", "/login", 303, 0, "", 'Mozilla/5.0 "quoted" Firefox/121.0', 0.25
            ),  # noqa: E501
        ],
        1,
        id="caddy-default-truncated-last",
    ),
    pytest.param(
        "nginx.json",
        "JSON lines (nginx-style names, 9 fields known)",
        [
            LogRecord(
                "203.0.113.9",
                1705309201.0,
                "GET",
                "/shop/item/7",
                200,
                4321,
                "",
                "Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)",
                0.012,
            ),  # noqa: E501
            LogRecord(
                "198.51.100.7",
                1705309202.0,
                "GET",
                "/cart",
                200,
                100,
                "https://example.org/",
                "Mozilla/5.0 Firefox/121.0",
                0.003,
                "bob",
            ),  # noqa: E501
        ],
        0,
        id="nginx-escape-json",
    ),
    pytest.param(
        "traefik.json",
        "JSON lines (Traefik, 9 fields known)",
        [
            LogRecord(
                "203.0.113.9",
                1705312801.123456,
                "GET",
                "/docs/intro?lang=en",
                200,
                2048,
                "",
                "Mozilla/5.0 (compatible; ClaudeBot/1.0; +claudebot@anthropic.com)",
                0.003456789,
            ),  # noqa: E501
        ],
        0,
        id="traefik-json-nanoseconds",
    ),
    pytest.param(
        "iis.log",
        "W3C extended (IIS, 15 fields)",
        [
            LogRecord("203.0.113.9", 1705312801.0, "GET", "/default.aspx?id=7&x=1", 200, 0, "", GOOGLEBOT_UA, 0.046),
            LogRecord(
                "198.51.100.7",
                1705312802.0,
                "GET",
                "/Account/Login.aspx",
                302,
                0,
                "https://example.org/",
                "Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/120.0",
                0.015,
            ),  # noqa: E501
            LogRecord("203.0.113.9", 1705320001.0, "GET", "/news", 200, 5120, "", BINGBOT_SHORT_UA, 0.12),
        ],
        0,
        id="iis-plus-for-space-header-again-after-restart",
    ),
    pytest.param(
        "cloudfront.log",
        "W3C extended (CloudFront, 19 fields)",
        [
            LogRecord(
                "203.0.113.9",
                1705312801.0,
                "GET",
                "/images/cat.html?size=large",
                200,
                2048,
                "",
                "Mozilla/5.0 (compatible; DuckDuckBot/1.0)",
                0.002,
            ),  # noqa: E501
        ],
        0,
        id="cloudfront-tabs-percent-encoding-seconds",
    ),
]


@pytest.mark.parametrize(("name", "description", "records", "malformed"), EXPECTED)
def test_logformats_detected_and_read_exactly(
    name: str, description: str, records: list[LogRecord], malformed: int
) -> None:
    reader = LogReader(FORMATS / name)
    assert reader.format.description == description
    assert list(reader) == records
    assert reader.malformed == malformed


@pytest.mark.parametrize(("name", "description", "records", "malformed"), EXPECTED)
def test_logformats_fast_path_gives_the_same_requests(
    name: str, description: str, records: list[LogRecord], malformed: int, tmp_path: Path
) -> None:
    path = tmp_path / (name + ".gz")
    path.write_bytes(gzip.compress((FORMATS / name).read_bytes()))
    reader = LogReader(path)
    rows = [row for block in reader.field_rows() for row in block]
    assert [(row[0].split(" ")[1], int(row[1])) for row in rows] == [(r.target, r.status) for r in records]
    days = [reader.format.day_of(row[4]) for row in rows]
    assert all(day is not None and 19_700 < day < 19_740 for day in days)
    assert reader.malformed == malformed


def test_logformats_spec_rebuilds_the_format_in_another_process() -> None:
    for name in ("nginx-timed-upstream.log", "caddy.json", "iis.log", "apache-vhost.log"):
        detected = LogReader(FORMATS / name).format
        again = make_format(detected.spec)
        assert again.spec == detected.spec and again.description == detected.description


def test_logformats_json_fields_mapped_by_the_operator(tmp_path: Path) -> None:
    path = tmp_path / "app.json"
    path.write_text('{"@t": "2024-01-15T10:00:01Z", "verb": "GET", "where": "/x", "code": 200, "ua": "Googlebot"}\n')
    spec = "json:time=@t,method=verb,target=where,status=code,user_agent=ua"
    (record,) = list(LogReader(path, spec))
    assert (record.timestamp, record.method, record.target, record.status, record.user_agent) == (
        1705312801.0,
        "GET",
        "/x",
        200,
        "Googlebot",
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"", "is empty", id="empty"),
        pytest.param(b"# crawlergate\n\nA README, not a log.\n", "its first line is '# crawlergate'", id="readme"),
        pytest.param(bytes(range(256)) * 40, "no line reads as an access log", id="random-bytes"),
        pytest.param(b'{"not": "a request"}\n', "no line reads as an access log", id="json-without-request"),
    ],
)
def test_logformats_no_log_is_one_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "file.log"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        _ = LogReader(path).format


@pytest.mark.parametrize("command", [["analyze"], ["simulate", "--no-cache"], ["classify", "--log"]])
@pytest.mark.parametrize("content", [b"", b"# A README\n\nNot a log at all.\n", bytes(range(256)) * 40])
def test_logformats_every_command_refuses_a_file_that_is_no_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], content: bytes
) -> None:
    path = tmp_path / "file.log"
    path.write_bytes(content)
    assert main([*command, str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0] and str(path) in err[0]


def test_logformats_replay_refuses_a_file_that_is_no_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "README.md"
    path.write_text("# Not a log\n")
    assert main(["replay", str(path), "--target", "http://127.0.0.1:9"]) == 2
    assert "no line reads as an access log" in capsys.readouterr().err


def test_logformats_mostly_malformed_log_warns_with_an_example(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = (FORMATS / "nginx-timed-upstream.log").read_text()
    path = tmp_path / "mixed.log"
    path.write_text(good + "this line is no request\n" * 2)
    assert main(["classify", "--log", str(path)]) == 0
    err = capsys.readouterr().err
    assert "read as nginx/Apache combined + 4 extra fields" in err
    assert "warning: 2 of 5 lines (40.0%) did not read" in err and "line 4: 'this line is no request'" in err


def test_logformats_detector_prefers_combined_over_common_with_a_tail() -> None:
    combined = '1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET / HTTP/1.1" 200 5 "-" "UA"'
    detected = detect_format([combined, combined[:60]])
    assert detected is not None and detected.description.startswith("nginx/Apache combined")


def test_logformats_truncated_gzip_keeps_everything_before_the_damage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = (FORMATS / "nginx-timed-upstream.log").read_text().splitlines()[0] + "\n"
    data = gzip.compress((line * 5000).encode())
    path = tmp_path / "cut.log.gz"
    path.write_bytes(data[: len(data) // 2])
    records = sum(1 for _ in LogReader(path))
    rows = sum(len(block) for block in LogReader(path).field_rows())
    assert records > 2000 and abs(rows - records) <= 1  # the fast path keeps as much as the slow one
    assert main(["simulate", "--no-cache", str(path)]) == 0
    assert "warning: the log ends early" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "description", "duration"),
    [
        pytest.param(
            f'1.2.3.4 - - [15/Jan/2024:10:00:01 +0000] "GET /a HTTP/1.1" 200 5 "-" "{GOOGLEBOT_SHORT_UA}" 761 0.004 '
            "[default-web-80] [] 10.0.0.7:80 5 0.004 200 abc",
            "response time in extra field 2, seconds",
            0.004,
            id="ingress-nginx-request-length-then-request-time",
        ),
        pytest.param(
            f'1.2.3.4 - - [15/Jan/2024:10:00:01 +0000] "GET /a HTTP/1.1" 200 5 "-" "{GOOGLEBOT_SHORT_UA}" 1000 '
            '"forum@docker" "http://10.0.0.7:80" 57ms',
            "response time in extra field 4, milliseconds",
            0.057,
            id="traefik-common-log",
        ),
        pytest.param(
            f'1.2.3.4 - - [15/Jan/2024:10:00:01 +0000] "GET /a HTTP/1.1" 200 5 "-" "{GOOGLEBOT_SHORT_UA}" 812 5120',
            "no response-time field",
            None,
            id="apache-bytes-in-and-out",
        ),
        pytest.param(
            '203.0.113.5, 10.0.0.2 - - [15/Jan/2024:10:00:01 +0000] "GET /a HTTP/1.1" 200 5 "-" '
            f'"{GOOGLEBOT_SHORT_UA}" 35',
            "response time in extra field 1, microseconds",
            0.000035,
            id="forwarded-for-list-first-and-a-fast-percent-D",
        ),
    ],
)
def test_logformats_response_time_only_where_the_log_says(
    tmp_path: Path, line: str, description: str, duration: float | None
) -> None:
    path = tmp_path / "access.log"
    path.write_text((line + "\n") * 20)
    reader = LogReader(path)
    assert description in reader.format.description
    records = list(reader)
    assert len(records) == 20 and records[0].duration_s == (pytest.approx(duration) if duration else None)


def test_logformats_nginx_msec_and_iso_times_in_a_text_format(tmp_path: Path) -> None:
    path = tmp_path / "msec.log"
    path.write_text(f'1705312801.782 203.0.113.9 "GET / HTTP/1.1" 200 16197 "{GOOGLEBOT_SHORT_UA}" 0.057\n')
    spec = '$msec $remote_addr "$request" $status $body_bytes_sent "$http_user_agent" $request_time'
    (record,) = list(LogReader(path, spec))
    assert record.timestamp == pytest.approx(1705312801.782) and record.duration_s == 0.057
    iso = tmp_path / "iso.log"
    iso.write_text(f'1.2.3.4 - - [2024-01-15T10:00:01+00:00] "GET / HTTP/1.1" 200 5 "-" "{GOOGLEBOT_SHORT_UA}"\n')
    (record,) = list(LogReader(iso))
    assert record.timestamp == 1705312801.0


@pytest.mark.parametrize(
    "damage", [pytest.param("\ufeff", id="bom"), pytest.param('ttp/1.1", "status": 2}\n', id="cut")]
)
def test_logformats_json_read_although_the_first_line_is_damaged(tmp_path: Path, damage: str) -> None:
    good = (FORMATS / "nginx.json").read_text()
    path = tmp_path / "log.json"
    path.write_text(damage + good)
    reader = LogReader(path)
    assert reader.format.description.startswith("JSON lines")
    assert len(list(reader)) == 2


@pytest.mark.parametrize(
    ("magic", "name"),
    [pytest.param(b"BZh91AY&SY", "bzip2", id="bzip2"), pytest.param(b"\xfd7zXZ\x00\x00", "xz", id="xz")],
)
def test_logformats_other_compressions_are_named(tmp_path: Path, magic: bytes, name: str) -> None:
    path = tmp_path / "access.log.x"
    path.write_bytes(magic + bytes(100))
    with pytest.raises(ConfigError, match=f"compressed with {name}"):
        _ = LogReader(path).format


def test_logformats_a_pipe_is_refused_with_the_reason(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="no regular file"):
        _ = LogReader(fifo).format


def test_logformats_cloudfront_user_agent_encoded_twice(tmp_path: Path) -> None:
    header = (FORMATS / "cloudfront.log").read_text().splitlines()[:2]
    row = (FORMATS / "cloudfront.log").read_text().splitlines()[2].split("\t")
    row[10] = "Mozilla/5.0%2520(compatible;%2520Googlebot/2.1;%2520+http://www.google.com/bot.html)"
    path = tmp_path / "cf.log"
    path.write_text("\n".join([*header, "\t".join(row)]) + "\n")
    (record,) = list(LogReader(path))
    assert record.user_agent == "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"


def test_logformats_unwritable_output_is_refused_before_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = FORMATS / "nginx-timed-upstream.log"
    assert main(["analyze", str(log), "--json", str(tmp_path / "missing-folder" / "out.json")]) == 2
    assert "Cannot write" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [
        ("0.0025", 0.0025),  # duration_format "seconds", Caddy's default
        ('"2.5ms"', 0.0025),  # "string": a Go duration
        ('"1m2.5s"', 62.5),
        ("2500000", 0.0025),  # "nano"
    ],
)
def test_caddy_duration_formats(tmp_path: Path, duration: str, seconds: float) -> None:
    line = (FORMATS / "caddy.json").read_text().splitlines()[0]
    start = line.index('"duration":') + len('"duration":')
    end = min(index for index in (line.find(",", start), line.find("}", start)) if index != -1)
    log = tmp_path / "caddy.json"
    log.write_text(line[:start] + duration + line[end:] + "\n")
    (record,) = LogReader(log)
    assert record.duration_s == pytest.approx(seconds)
