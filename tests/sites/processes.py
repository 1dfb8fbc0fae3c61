"""Servers as subprocesses on loopback: started in their own process group, waited for, always killed."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx
import pytest

from crawlergate.demo.run import free_port

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

__all__ = ["REPO", "VENV_BIN", "PortReservation", "Service", "clean_environment", "free_port", "run"]


class PortReservation:
    """A loopback port kept bound (not listening) until ``release``: nobody else gets it meanwhile.

    For a gate whose address its origin must know before the gate starts, perhaps much later.
    """

    def __init__(self) -> None:
        self._socket: socket.socket | None = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.port = int(self._socket.getsockname()[1])

    def release(self) -> int:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        return self.port


def clean_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without CRAWLERGATE_* and DJANGO_* variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRAWLERGATE_", "DJANGO_", "TRAC_"))}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 120) -> str:
    """Run a set-up command to completion; fail the test with its output when it fails."""
    try:
        done = subprocess.run(
            list(argv), cwd=REPO, env=clean_environment(env), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(argv)} did not finish in {timeout} s: {exc.stderr!r}")
    if done.returncode != 0:
        pytest.fail(f"{' '.join(argv)} failed with status {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


class Service:
    """One server process: its own process group, output in a log file, readiness by an HTTP probe.

    ``probe`` gets an httpx.Client and returns True once the server is ready; transport errors count
    as not ready. ``stop`` sends SIGTERM to the group, then SIGKILL, so workers (gunicorn) go too.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        probe: Callable[[httpx.Client], bool] | None = None,
        start_timeout: float = 45.0,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.port = port
        self.env = clean_environment(env)
        self.log_path = log_dir / f"{name}.log"
        self.probe = probe or (lambda client: client.get("/").status_code < 500)
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 6000) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return text[-chars:]

    def start(self) -> Service:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.argv,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout
        with httpx.Client(base_url=self.url, timeout=5.0) as client:
            while True:
                status = self.process.poll()
                if status is not None:
                    self.stop()
                    pytest.fail(f"{self.name} exited with status {status} on start:\n{self.log_tail()}")
                try:
                    if self.probe(client):
                        return self
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"{self.name} did not become ready in {self.start_timeout} s:\n{self.log_tail()}")
                time.sleep(0.1)

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        # Whatever is left of the group (gunicorn workers, a hung master) is killed.
        self._signal_group(signal.SIGKILL)
        if process.poll() is None:
            process.wait(timeout=10)
        self.process = None

    def _signal_group(self, signum: int) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)
