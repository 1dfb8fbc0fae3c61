"""The systemd units in deploy/systemd/ parse cleanly (``systemd-analyze verify``: no warning at all) and the
gate's unit is hardened (``systemd-analyze security --offline``), where systemd-analyze is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).parent.parent / "deploy" / "systemd"
ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
# systemd's own scale: 0 is fully locked down, 10 is unprotected; below 2 it says "OK".
MAX_EXPOSURE = 2.0


def _installed(unit: Path, tmp_path: Path) -> Path:
    """The unit as installed here: ExecStart names this venv's crawlergate, which verify checks exists."""
    text = unit.read_text().replace(
        "/opt/crawlergate/.venv/bin/crawlergate", str(Path(sys.executable).parent / "crawlergate")
    )
    installed = tmp_path / unit.name
    installed.write_text(text)
    return installed


@pytest.mark.parametrize("unit", sorted(UNITS.glob("*.service")), ids=lambda path: path.name)
def test_systemd_unit_verifies_without_a_warning(unit: Path, tmp_path: Path) -> None:
    assert ANALYZE is not None
    checked = subprocess.run([ANALYZE, "verify", str(_installed(unit, tmp_path))], capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout + checked.stderr == "", checked.stdout + checked.stderr


def test_systemd_gate_unit_is_hardened(tmp_path: Path) -> None:
    assert ANALYZE is not None
    unit = _installed(UNITS / "crawlergate.service", tmp_path)
    report = subprocess.run([ANALYZE, "security", "--offline=true", str(unit)], capture_output=True, text=True)
    found = re.search(r"Overall exposure level for \S+: ([\d.]+)", report.stdout)
    if found is None:
        pytest.skip(f"systemd-analyze security --offline is not available here: {report.stderr.strip()[:200]}")
    assert float(found.group(1)) <= MAX_EXPOSURE, report.stdout
