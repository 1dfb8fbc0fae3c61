"""`crawlergate replay`: a log sent again to a server, counted by class, outcome and status, closed or open loop at
the log's pace, and two runs compared in words."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from crawlergate.classify import Classifier
from crawlergate.config import ClassifySettings
from crawlergate.tools.logparse import LogReader
from crawlergate.tools.replay import ReplayRequest, replay, requests_from_log
from tests.conftest import ServerThread, free_port
from tests.visitors import FIREFOX_UA, GOOGLEBOT_UA

pytestmark = pytest.mark.e2e


def known_app() -> Starlette:
    """Answers that the tests can predict: /ok/* 200 with an outcome header, /missing 404, /slow waits."""

    async def ok(request: Request) -> Response:
        return PlainTextResponse(
            "ok", headers={"x-crawlergate": "l1-hit" if "bot" in request.headers["user-agent"] else "pass"}
        )

    async def slow(request: Request) -> Response:
        await asyncio.sleep(0.05)
        return PlainTextResponse("slow")

    async def missing(request: Request) -> Response:
        return PlainTextResponse("no", status_code=404)

    return Starlette(routes=[Route("/ok/{n}", ok), Route("/slow/{n}", slow), Route("/missing", missing)])


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    thread = ServerThread(known_app()).start()
    yield thread
    thread.stop()


def _line(agent: str, target: str, second: int, method: str = "GET") -> str:
    return (
        f'1.2.3.4 - - [10/Oct/2000:13:55:{second:02d} +0000] "{method} {target} HTTP/1.1" 200 10 "-" "{agent}" 1000\n'
    )


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "access.log"
    lines = [_line(GOOGLEBOT_UA, f"/ok/{n}", n % 60) for n in range(30)]
    lines += [_line(FIREFOX_UA, f"/ok/{n}", n % 60) for n in range(20)]
    lines += [_line(FIREFOX_UA, "/missing", 1), _line(GOOGLEBOT_UA, "/ok/post", 1, method="POST"), "garbage\n"]
    path.write_text("".join(lines))
    return path


def test_replay_counts_classes_outcomes_and_statuses(server: ServerThread, log: Path) -> None:
    classifier = Classifier.from_settings(ClassifySettings())
    requests = requests_from_log(LogReader(log), classifier)
    assert len(requests) == 51  # the POST is not replayed, the garbage line is skipped
    result = asyncio.run(replay(requests, server.url, concurrency=4))
    summary = result.summary()
    assert summary["requests"] == 51 and summary["errors"] == 0
    assert summary["crawler"]["count"] == 30 and summary["crawler"]["outcomes"] == {"l1-hit": 30}
    assert summary["human"]["count"] == 21 and summary["human"]["outcomes"] == {"pass": 20, "none": 1}
    assert summary["human"]["statuses"] == {"200": 20, "404": 1}
    assert summary["throughput_rps"] > 0
    assert set(summary["crawler"]["ttfb_ms"]) == {"p50", "p90", "p99", "mean"}


def test_replay_filters(log: Path) -> None:
    classifier = Classifier.from_settings(ClassifySettings())
    assert len(requests_from_log(LogReader(log), classifier, kind="crawler")) == 30
    assert len(requests_from_log(LogReader(log), classifier, limit=5)) == 5
    assert len(requests_from_log(LogReader(log), classifier, path_pattern=lambda t: t == "/missing")) == 1


def test_replay_counts_errors_without_stopping() -> None:
    requests = [ReplayRequest("GET", "/", FIREFOX_UA, "human", 0.0)] * 3
    result = asyncio.run(replay(requests, f"http://127.0.0.1:{free_port()}", concurrency=2, timeout_s=2))
    assert result.summary()["errors"] == 3 and result.samples == []


def test_replay_open_loop_shows_a_slow_server_queue(server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    # 40 requests scheduled 5 ms apart to a server that takes 50 ms each and is allowed one at a
    # time: closed-loop timing would report ~50 ms each; counted from the schedule, latency grows.
    requests = [ReplayRequest("GET", f"/slow/{n}", FIREFOX_UA, "human", n * 0.005) for n in range(40)]
    from crawlergate.tools import replay as replay_module

    monkeypatch.setattr(replay_module, "MAX_IN_FLIGHT", 1)
    result = asyncio.run(replay(requests, server.url, speed=1.0))
    latencies = [sample.total_ms for sample in sorted(result.samples, key=lambda s: s.finished_s)]
    assert latencies[-1] > 10 * latencies[0]
    assert latencies[-1] > 1000  # 40 x 50 ms of queue, minus the 200 ms of schedule


def test_replay_open_loop_keeps_the_log_pace(server: ServerThread) -> None:
    requests = [ReplayRequest("GET", f"/ok/{n}", FIREFOX_UA, "human", n * 0.1) for n in range(6)]
    started = time.perf_counter()
    asyncio.run(replay(requests, server.url, speed=2.0))
    assert time.perf_counter() - started >= 0.25  # 0.5 s of log at twice the speed


def test_cli_replay_compare(
    server: ServerThread, log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crawlergate.cli import main

    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    argv = ["replay", str(log), "--target", server.url, "--compare", server.url, "--json", str(out_json)]
    assert main([*argv, "--report", str(out_html), "--concurrency", "3"]) == 0
    assert "throughput:" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["first"]["requests"] == data["second"]["requests"] == 51
    assert data["ratios"]["throughput"] > 0
    html = out_html.read_text()
    assert html.count('class="chart"') >= 4 and "Through crawlergate: crawlers " in html


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--target", "ftp://x"], "must be an http", id="bad-target"),
        pytest.param(["--target", "http://x", "--path", "("], "not a regular expression", id="bad-regex"),
        pytest.param(["--target", "http://x", "--class", "crawler", "--path", "^/nothing"], "No GET/HEAD", id="empty"),
    ],
)
def test_cli_replay_errors(log: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.cli import main

    assert main(["replay", str(log), *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_replay_nothing_listening_is_a_failure_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crawlergate.cli import main
    from tests.conftest import free_port

    log = tmp_path / "access.log"
    log.write_text('1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET /t/1 HTTP/1.1" 200 10 "-" "Googlebot" 100\n' * 3)
    assert main(["replay", str(log), "--target", f"http://127.0.0.1:{free_port()}", "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert "every request to http://127.0.0.1:" in err and "ConnectError" in err


def test_cli_replay_refuses_concurrency_with_speed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.cli import main

    log = tmp_path / "access.log"
    log.write_text('1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET /t/1 HTTP/1.1" 200 10 "-" "Googlebot" 100\n')
    argv = ["replay", str(log), "--target", "http://127.0.0.1:9", "--speed", "2", "--concurrency", "4"]
    assert main(argv) == 2
    assert "give one" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("before", "after", "words"),
    [
        pytest.param(100.0, 1.9, "53× faster", id="faster"),
        pytest.param(2.0, 4.6, "2.30× slower", id="slower"),
        pytest.param(5.0, 5.01, "as fast", id="same"),
        pytest.param(0.0, 1.0, "n/a (no requests)", id="nothing"),
    ],
)
def test_replay_comparison_says_the_direction_in_words(before: float, after: float, words: str) -> None:
    from crawlergate.tools.replay import rate_change, time_change

    assert time_change(before, after) == words
    assert (
        rate_change(100.0, 184.0) == "1.84× more requests/s" and rate_change(184.0, 100.0) == "1.84× fewer requests/s"
    )


@pytest.mark.parametrize("target", ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "ftp://x", ""])
def test_cli_replay_bad_target_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str) -> None:
    from crawlergate.cli import main

    log = tmp_path / "access.log"
    log.write_text('1.2.3.4 - - [10/Oct/2000:13:55:36 +0000] "GET /t/1 HTTP/1.1" 200 10 "-" "Googlebot" 100\n')
    assert main(["replay", str(log), "--target", target]) == 2
    err = capsys.readouterr().err
    assert "must be an http:// or https:// URL" in err and "Traceback" not in err


def test_cli_classify_json_to_stdout_is_only_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from crawlergate.cli import main

    assert main(["classify", "--json", "-", "curl/8.5", "Mozilla/5.0 (compatible; Googlebot/2.1)"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"crawler": 2, "human": 0}
    assert "crawler\tcurl/8.5" in captured.err


def test_replay_sends_targets_as_the_wire_needs_them() -> None:
    from crawlergate.tools.replay import ReplayRequest, _Target

    target = _Target.parse("http://127.0.0.1:8080/base")
    wire = [
        target.request(ReplayRequest("GET", path, "UA", "human", 0.0)).split(b"\r\n")[0]
        for path in ('/search?q="x y"', "http://forum.example/page?a=1", "/caf%C3%A9", "/a b")
    ]
    assert wire == [
        b"GET /base/search?q=%22x%20y%22 HTTP/1.1",
        b"GET /base/page?a=1 HTTP/1.1",
        b"GET /base/caf%C3%A9 HTTP/1.1",
        b"GET /base/a%20b HTTP/1.1",
    ]


def test_replay_open_loop_sorts_a_log_out_of_time_order(server: ServerThread) -> None:
    # Apache stamps a request when it began and writes it when it ended; rotated logs get joined.
    offsets = [5.0, 1.0, 6.0, -86_400.0, 2.0]
    requests = [ReplayRequest("GET", f"/ok/{n}", FIREFOX_UA, "human", offset) for n, offset in enumerate(offsets)]
    result = asyncio.run(replay(requests, server.url, speed=200_000.0))
    summary = result.summary()
    assert summary["human"]["count"] == 5 and summary["errors"] == 0
    assert summary["human"]["ttfb_ms"]["p99"] < 1000  # no day-long latency invented from the order


def test_replay_class_that_only_failed_shows_no_time(capsys: pytest.CaptureFixture[str]) -> None:
    from crawlergate.tools.replay import format_summary

    requests = [ReplayRequest("GET", "/", GOOGLEBOT_UA, "crawler", 0.0)] * 2
    result = asyncio.run(replay(requests, f"http://127.0.0.1:{free_port()}", concurrency=1, timeout_s=2))
    text = format_summary([result])
    assert "crawler TTFB p50 (ms)" in text and "n/a" in text
    assert "crawler errors" in text and "ConnectError:2" in text
