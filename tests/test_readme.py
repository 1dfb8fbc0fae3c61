"""The README is true: it stays a short page, every ``crawlergate …`` line it shows parses with the real parser,
and every block of commands or code in it runs as pasted (only its port numbers changed to free ones) against
real servers on loopback, in a fresh folder with no configuration file."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from crawlergate.cli import _parser
from crawlergate.demo.run import free_port
from tests.visitors import FIREFOX, GOOGLEBOT

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
BIN = Path(sys.executable).parent

# Blocks another test or CI runs: the install line and the demo (tests/demo/test_run.py runs the demo; .ci/run
# installs on a clean clone), the test command (.ci/run runs it).
RUN_ELSEWHERE = ("python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/crawlergate demo", "scripts/test")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


def _block(language: str, starting: str) -> str:
    (block,) = [block for block in _blocks(language) if block.startswith(starting)]
    return block


def _command_lines() -> list[str]:
    """Commands in the README's sh blocks and in inline code with flags; a synopsis counts without its
    [optional] parts (lines left with ``a | b`` choices are skipped)."""
    text = README.read_text(encoding="utf-8")
    lines, joined = [], ""
    blocks = _blocks("sh") + re.findall(r"`(crawlergate [^`\n]* --[^`\n]+)`", text)
    for block in blocks:
        for line in block.splitlines():
            joined += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
            if line.endswith("\\"):
                continue
            command, joined = joined.split("#")[0].strip(), ""
            command = re.sub(r"^\$ |^\.venv/bin/", "", command).removesuffix("&").strip()
            while re.search(r"\[[^\[\]]*\]", command):
                command = re.sub(r"\s*\[[^\[\]]*\]", "", command)
            if command.startswith("crawlergate ") and not re.search(r"[\[\]|…]|\.\.\.", command):
                lines.append(command)
    return list(dict.fromkeys(lines))


def test_readme_is_a_short_page() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_readme_shows_commands() -> None:
    assert len(_command_lines()) >= 6


@pytest.mark.parametrize("line", _command_lines())
def test_readme_command_parses_as_written(line: str) -> None:
    parser = _parser()
    parser.exit_on_error = False
    args = parser.parse_args(shlex.split(line)[1:])
    assert args.command is not None


def test_every_block_of_the_readme_is_run_by_a_test() -> None:
    run_here = ('cd "$(mktemp -d)"', "crawlergate serve --origin", "crawlergate analyze")
    shown = [block.strip() for block in _blocks("sh")]
    assert sorted(shown) == sorted([*RUN_ELSEWHERE, *(_block("sh", start).strip() for start in run_here)])
    assert len(_blocks("python")) == 2


def _with_ports(block: str, ports: dict[str, int]) -> str:
    for shown, port in ports.items():
        block = re.sub(rf"\b{shown}\b", str(port), block)
    return block


def _environment() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}


@contextlib.contextmanager
def _running(argv: list[str], cwd: Path, url: str) -> Iterator[subprocess.Popen[bytes]]:
    """A server in its own process group, until it answers ``url``; stopped with everything it started."""
    log = cwd / f"server-{len(list(cwd.glob('server-*.log')))}.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(argv, cwd=cwd, env=_environment(), start_new_session=True, stderr=output)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url, timeout=2).status_code < 500:
                    break
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"nothing answered at {url}: {log.read_text()}"
            time.sleep(0.1)
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def _run_shell(block: str, cwd: Path, **environment: str) -> str:
    """The block run by bash, stopping at the first failing command; its output is a file, not a pipe, so
    a server the block leaves running cannot hold the test."""
    with open(cwd / "block-output.txt", "w+") as output:
        process = subprocess.Popen(
            ["bash", "-e", "-c", block],
            cwd=cwd,
            env={**_environment(), **environment},
            start_new_session=True,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            process.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        output.seek(0)
        text = output.read()
    assert process.returncode == 0, text
    return text


@pytest.mark.e2e
def test_readme_try_it_with_curl_shows_a_crawler_a_suspect_and_a_person(tmp_path: Path) -> None:
    gate_port = free_port()
    block = _with_ports(_block("sh", 'cd "$(mktemp -d)"'), {"8000": free_port(), "8080": gate_port})
    output = _run_shell(block, tmp_path, CRAWLERGATE_SERVER_PORT=str(gate_port), TMPDIR=str(tmp_path))
    assert re.findall(r"(?i)x-crawlergate: (\S+)", output) == ["miss", "l1-hit", "l1-hit", "pass"], output
    verdicts = re.findall(r'(?:miss|l1-hit|pass) "([^"]+)" "([^"]*)"', output)
    assert [verdict for verdict, _ in verdicts] == ["crawler:Googlebot", "crawler:Googlebot", "suspect:hidden", "human"]
    assert "no-sec-fetch" in verdicts[2][1]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("file", "server"),
    [
        pytest.param("app.py", ["-m", "uvicorn", "app:app", "--port", "{port}"], id="asgi"),
        pytest.param("wsgi_app.py", ["-m", "gunicorn", "wsgi_app:app", "-b", "127.0.0.1:{port}"], id="wsgi"),
    ],
)
def test_readme_application_runs_as_pasted_with_no_config_file(tmp_path: Path, file: str, server: list[str]) -> None:
    (tmp_path / file).write_text(_blocks("python")[0 if file == "app.py" else 1])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, *(part.format(port=port) for part in server)]
    with _running(argv, tmp_path, f"{base}/_crawlergate/healthz"):
        outcomes = [httpx.get(base, headers=headers).headers["x-crawlergate"] for headers in (GOOGLEBOT, GOOGLEBOT)]
        person = httpx.get(base, headers=FIREFOX)
        dashboard = httpx.get(f"{base}/_crawlergate/")
    assert outcomes == ["miss", "l1-hit"]
    assert person.headers["x-crawlergate"] == "pass" and b"Hello" in person.content
    assert dashboard.status_code == 200
    assert not list(tmp_path.glob("*.toml"))


@pytest.mark.e2e
def test_readme_serve_and_log_tools_run_as_written(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<html><body>hello</body></html>")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    origin_port, gate_port = free_port(), free_port()
    origin = [sys.executable, "-m", "http.server", str(origin_port), "--bind", "127.0.0.1", "--directory", "site"]
    serve = shlex.split(_with_ports(_block("sh", "crawlergate serve --origin"), {"8000": origin_port}))
    serve = [str(BIN / "crawlergate"), *serve[1:], "--port", str(gate_port)]
    with (
        _running(origin, tmp_path, f"http://127.0.0.1:{origin_port}/"),
        _running(serve, tmp_path, f"http://127.0.0.1:{gate_port}/_crawlergate/healthz"),
    ):
        crawler = httpx.get(f"http://127.0.0.1:{gate_port}/", headers=GOOGLEBOT)
        output = _run_shell(_with_ports(_block("sh", "crawlergate analyze"), {"8080": gate_port}), tmp_path)
    assert crawler.headers["x-crawlergate"] == "miss"
    assert "crawler" in output
    assert (tmp_path / "simulate.html").stat().st_size > 0 and (tmp_path / "replay.html").stat().st_size > 0
