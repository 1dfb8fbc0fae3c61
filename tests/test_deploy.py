"""deploy/ as a whole: every file in it is exercised or validated by a test, and the example settings load."""

from __future__ import annotations

from pathlib import Path

from crawlergate.config import load_settings

ROOT = Path(__file__).parent.parent
DEPLOY = ROOT / "deploy"
# The checks that run or validate deploy/'s files: each names the files it reads.
CHECKS = ("test_deploy.py", "test_deploy_files.py", "test_deploy_local.py", "test_deploy_systemd.py",
          "test_nginx_front.py")  # fmt: skip


def test_deploy_example_settings_load() -> None:
    settings = load_settings(DEPLOY / "crawlergate.toml", environ={})
    assert settings.l1.memcached == ("127.0.0.1:11211",) and settings.server.public_url == "https://forum.example"


def test_deploy_every_file_is_checked_by_a_test() -> None:
    checks = "\n".join((ROOT / "tests" / name).read_text() for name in CHECKS)
    unchecked = []
    for path in sorted(DEPLOY.rglob("*")):
        if not path.is_file() or path.suffix == ".md":
            continue
        named = path.relative_to(DEPLOY)
        # A test names the file (deploy/x or "x"), or the folder it globs (systemd/*.service, k8s/*.yaml).
        if not (str(named) in checks or path.name in checks or (f'"{named.parent}"' in checks and named.parent.name)):
            unchecked.append(str(named))
    assert unchecked == []
