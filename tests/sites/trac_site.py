"""A Trac project for the tests: built once with trac-admin and trac_content.py, copied per server.

Trac sends every guest two cookies (``trac_form_token``, ``trac_session``; the latter even on static
files under /chrome), ``Cache-Control: must-revalidate`` and ``Expires`` in 1999. Its pages use
path-only links, but its ``Location`` headers are absolute, built from the request's Host (it never
reads ``X-Forwarded-*``). With ``[trac] base_url`` unset it also keeps the first request's Host as the
environment's URL (used in notification mails): the readiness probe asks with the public Host.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.sites.processes import REPO, VENV_BIN, Service, free_port, run

USER = "alice"
PASSWORD = "alice-secret-pw"
REALM = "crawlergate-tests"  # as in trac_wsgi.py

# Links a crawl does not follow on Trac: other versions, diffs, histories and machine formats of a page.
# They are pages too, but a 150-page crawl would spend itself on them instead of tickets and milestones.
CRAWL_SKIP = re.compile(r"[?&](format|version|action)=")


@dataclass(frozen=True)
class TracProject:
    env: Path
    htpasswd: Path

    def copy(self, where: Path) -> TracProject:
        """A private copy, so what one server's people change is not seen by another's crawl."""
        env = where / "env"
        shutil.copytree(self.env, env)
        return TracProject(env=env, htpasswd=self.htpasswd)


def build(root: Path) -> TracProject:
    """initenv, the content script, the member's password and permissions."""
    env = root / "env"
    admin = str(VENV_BIN / "trac-admin")
    run([admin, str(env), "initenv", "Crawlergate test project", "sqlite:db/trac.db"])
    run([sys.executable, str(REPO / "tests" / "sites" / "trac_content.py"), str(env), USER])
    run([admin, str(env), "permission", "add", USER, "TRAC_ADMIN"])
    htpasswd = root / "htpasswd"
    digest = base64.b64encode(hashlib.sha1(PASSWORD.encode()).digest()).decode()
    htpasswd.write_text(f"{USER}:{{SHA}}{digest}\n", encoding="utf-8")
    return TracProject(env=env, htpasswd=htpasswd)


def host_probe(public_host: str, path: str = "/"):
    """A readiness probe that asks with the public Host (Trac keeps its first request's Host)."""

    def probe(client: httpx.Client) -> bool:
        return client.get(path, headers={"host": public_host}).status_code == 200

    return probe


def tracd(project: TracProject, log_dir: Path, public_host: str, port: int | None = None) -> Service:
    port = port or free_port()
    argv = [str(VENV_BIN / "tracd"), "-s", "-b", "127.0.0.1", "--port", str(port)]
    argv += [f"--basic-auth=*,{project.htpasswd},{REALM}", str(project.env)]
    return Service("tracd", argv, port=port, log_dir=log_dir, probe=host_probe(public_host))


def wsgi_env(project: TracProject) -> dict[str, str]:
    return {"TRAC_ENV": str(project.env), "TRAC_HTPASSWD": str(project.htpasswd)}
