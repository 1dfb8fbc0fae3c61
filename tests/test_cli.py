"""The command line: `classify` on arguments, files and logs, one-line errors instead of tracebacks, the installed
console script, the public API's names and every command's help."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import HTMLResponse
from starlette.routing import Route

from crawlergate.cli import main
from tests.conftest import DATA, ServerThread


def test_cli_classify_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    firefox = "Mozilla/5.0 (Windows NT 10.0; rv:133.0) Gecko/20100101 Firefox/133.0"
    assert main(["classify", "Googlebot/2.1", firefox]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "crawler\tGooglebot/2.1",
        "human\tMozilla/5.0 (Windows NT 10.0; rv:133.0) Gecko/20100101 Firefox/133.0",
    ]


def test_cli_classify_file_keeps_input_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "uas.txt"
    path.write_bytes(b"curl/8.0\r\n\nMozilla/5.0 (X11; Linux x86_64)\n\xffbot\n")
    assert main(["classify", "--file", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["crawler\tcurl/8.0", "human\t", "human\tMozilla/5.0 (X11; Linux x86_64)", "crawler\t\ufffdbot"]


@pytest.mark.parametrize("command", [["classify", "--file"], ["warm", "--origin", "http://127.0.0.1:9", "--urls"]])
def test_cli_a_list_that_is_no_text_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    path = tmp_path / "list.txt.gz"  # a compressed list given where a text one is read: classified as garbage before
    path.write_bytes(gzip.compress(b"Googlebot/2.1\n/t/1\n"))
    assert main([*command, str(path)]) == 2
    captured = capsys.readouterr()
    assert "is not text (it holds NUL bytes)" in captured.err and not captured.out


def test_cli_classify_file_reads_a_pipe_whole() -> None:
    """`--file <(zcat agents.gz)`: the check for text looks at the start without taking it from the pipe."""
    lines = [f"Googlebot/2.1 n{number}" for number in range(1000)]
    command = [sys.executable, "-m", "crawlergate", "classify", "--file", "/dev/stdin"]
    done = subprocess.run(command, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"crawler\t{line}" for line in lines]


def test_cli_classify_families_column(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", "--families", "python-requests/2.31"]) == 0
    assert capsys.readouterr().out == "crawler\tHTTP libraries\tlibrary\tpython-requests/2.31\n"


def test_cli_classify_log_reports_shares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "share.json"
    assert main(["classify", "--log", str(DATA / "logs" / "combined-micros.log"), "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "crawler" in text and "Googlebot" in text and "time (s)" in text
    data = json.loads(out_json.read_text())
    assert data["requests"] == 3
    assert data["classes"]["crawler"]["requests"] == 1
    assert data["classes"]["crawler"]["time_share"] == pytest.approx(162109 / (162109 + 120000 + 102))
    assert data["malformed"] == 0


def test_cli_classify_log_without_time_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", "--log", str(DATA / "logs" / "combined.log")]) == 0
    assert "no response-time field" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["classify", "--file", "/nonexistent/uas.txt"], "cannot be read", id="missing-file"),
        pytest.param(["classify", "--log", "/nonexistent/access.log"], "cannot be read", id="missing-log"),
        pytest.param(["classify", "--config", "/nonexistent.toml", "x"], "does not exist", id="missing-config"),
        pytest.param(["classify"], "give user agents", id="nothing-to-do"),
        pytest.param(["demo", "trace", "--out", "/nonexistent/x.log"], "/nonexistent/x.log: No such", id="no-folder"),
        pytest.param(["check", "http://[::1/p"], "is not a URL: Invalid IPv6 URL", id="bad-url"),
        pytest.param(["stats", "--url", "http://[::1/x"], "not a URL this can ask", id="bad-gate-url"),
        pytest.param(
            ["invalidate", "--token", "t", "--url", "http://127.0.0.1:1", "t/1.html"],
            "is neither a path (/t/1.html) nor an http:// or https:// URL",
            id="invalidate-neither-path-nor-url",
        ),
        pytest.param(
            ["nginx-config", "--origin", "http://127.0.0.1:8000", "--gate", "127.0.0.1:8080; } server { listen 81"],
            "is not an address nginx can reach",
            id="gate-address-into-nginx",
        ),
    ],
)
def test_cli_errors_are_one_line_not_a_traceback(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_cli_bad_environment_setting(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CRAWLERGATE_CLASSIFY_MEMO_SIZE", "lots")
    assert main(["classify", "x"]) == 2
    assert "Setting 'classify.memo_size' has value 'lots'" in capsys.readouterr().err


def test_cli_installed_console_script_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "crawlergate", "classify", "Googlebot"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert result.stdout == "crawler\tGooglebot\n"


def test_public_api_names() -> None:
    import crawlergate

    for name in ("CrawlerGateMiddleware", "CrawlerGateWSGI", "Settings", "load_settings", "create_app"):
        assert name in crawlergate.__all__ and hasattr(crawlergate, name)


def test_cli_help_of_every_command_shows_each_options_default() -> None:
    import argparse

    from crawlergate.cli import _parser

    def options(parser: argparse.ArgumentParser, name: str):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command, sub in action.choices.items():
                    yield from options(sub, f"{name} {command}")
            elif action.option_strings and action.nargs != 0 and not action.required:
                yield name, parser, action

    undocumented = []
    for name, parser, action in options(_parser(), "crawlergate"):
        text = parser.formatter_class("crawlergate")._get_help_string(action) or ""  # type: ignore[attr-defined]
        writes_a_file = action.dest in ("json", "report", "file", "log", "compare", "sitemap", "urls", "help")
        if action.help is None or ("default" not in text and not writes_a_file):
            undocumented.append(f"{name} {action.option_strings[0]}")
    assert undocumented == []


def test_cli_help_never_shows_the_admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from crawlergate.cli import _parser

    monkeypatch.setenv("CRAWLERGATE_ADMIN_TOKEN", "s3cret-token")
    for command in ("stats", "invalidate"):
        parser = _parser()
        subparsers = next(action for action in parser._actions if action.dest == "command")
        assert "s3cret" not in subparsers.choices[command].format_help()  # type: ignore[attr-defined]


def test_cli_demo_forum_never_overwrites_a_file_it_did_not_make(tmp_path: Path, capsys) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert main(["demo", "forum", "--db", str(notes), "--port", "1"]) == 2
    assert "is not a demo forum's database" in capsys.readouterr().err and notes.read_text() == "my notes\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "forum", "--port", "70000"],
        ["demo", "forum", "--work-ms", "nan"],
        ["demo", "trace", "--out", "x.log", "--duration", "inf"],
        ["demo", "trace", "--out", "x.log", "--duration", "-5"],
    ],
)
def test_cli_demo_numbers_out_of_range_are_refused_before_anything_runs(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and "must be" in capsys.readouterr().err


def test_cli_stats_of_something_not_a_gate_says_so_in_one_line(capsys) -> None:
    async def page(request: StarletteRequest) -> HTMLResponse:
        return HTMLResponse("<html>\n<body>\n<h1>Not here</h1>\n</body>\n</html>\n", status_code=404)

    site = ServerThread(Starlette(routes=[Route("/{path:path}", page)])).start()
    try:
        assert main(["stats", "--url", site.url]) == 2
    finally:
        site.stop()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "answered 404 with a web page: is it the gate's address" in err


def test_stats_table_shows_direct_hits_in_a_column_of_their_own_when_there_are_any() -> None:
    """The JSON has direct_hits per class; the table's rows did not add up without them (operator review)."""
    from crawlergate.commands.gate import _class_rows

    with_front = _class_rows({"crawler": {"requests": 10, "l1_hits": 2, "direct_hits": 5, "misses": 3}})
    assert with_front[0].split()[:5] == ["requests", "L1", "hits", "L2", "hits"] and "direct" in with_front[0]
    assert with_front[1].split()[:6] == ["crawler", "10", "2", "0", "5", "3"]
    assert "direct" not in _class_rows({"crawler": {"requests": 10, "l1_hits": 2}})[0]
