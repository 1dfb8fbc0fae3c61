"""deploy/run-local.sh --check: the compose stack as real processes (demo forum, memcached, serve with two
workers), checked end to end and stopped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.memcached]

SCRIPT = Path(__file__).parent.parent / "deploy" / "run-local.sh"


def test_run_local_starts_the_stack_checks_it_and_stops(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    environ = {key: value for key, value in os.environ.items() if not key.startswith("CRAWLERGATE_")}
    environ |= {
        "FORUM_PORT": str(free_port()),
        "MEMCACHED_PORT": str(free_port()),
        "GATE_PORT": str(free_port()),
        "STATE_DIR": str(tmp_path),
        "CRAWLERGATE": str(bin_dir / "crawlergate"),
        "PYTHON": sys.executable,
    }
    run = subprocess.run(["bash", str(SCRIPT), "--check"], env=environ, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "check passed: ['miss'" in run.stdout and "Traceback" not in run.stderr
    assert "crawlergate serve: stopped" in run.stderr  # SIGTERM: a clean stop
