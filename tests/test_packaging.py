"""What `python -m build` makes is a package a user can install and run, and its metadata reads right.

The wheel and the sdist are built from this checkout without isolation (the build backend comes from the
test extra, so nothing is downloaded). The wheel's METADATA carries the licence expression, the licence
file and the project URLs (what `pip show` and an index page show); the sdist holds the licence, the
changelog and the contributor guide. Then the wheel is installed into a fresh venv with no index, and its
`crawlergate` command runs from there, not from the checkout.

The fresh venv gets the dependencies from the venv running these tests through a `.pth` file naming that
venv's site-packages. A plain path line in a `.pth` is added to `sys.path` as it is, without reading the
`.pth` files inside it, so the checkout's editable install stays out and the fresh venv imports the
wheel it installed.
"""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.message import Message
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
URLS = {
    "Homepage": "https://crawlergate.github.io/crawlergate/",
    "Documentation": "https://crawlergate.github.io/crawlergate/",
    "Source": "https://github.com/crawlergate/crawlergate",
    "Changelog": "https://github.com/crawlergate/crawlergate/blob/main/CHANGELOG.md",
    "Issues": "https://github.com/crawlergate/crawlergate/issues",
}


def _env() -> dict[str, str]:
    """The environment of a child: no PYTHONPATH that could bring the checkout in, no pip configuration
    that could point at an index, no pip version check (it asks PyPI)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    return env


def _run(args: list[str | Path], cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT], cwd=out)
    return out


def _one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {dist}, found {found}"
    return found[0]


def _metadata(text: str) -> Message:
    return email.parser.Parser().parsestr(text)


def test_the_wheel_carries_the_licence_and_the_project_urls(dist: Path) -> None:
    with zipfile.ZipFile(_one(dist, "crawlergate-*.whl")) as wheel:
        names = wheel.namelist()
        (info,) = {name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info")}
        meta = _metadata(wheel.read(f"{info}/METADATA").decode())
        licence = wheel.read(f"{info}/licenses/LICENSE").decode()

    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert licence == (ROOT / "LICENSE").read_text()
    assert "MIT License" in licence
    urls = dict(line.split(", ", 1) for line in meta.get_all("Project-URL") or [])
    assert urls == URLS
    classifiers = meta.get_all("Classifier") or []
    assert "Framework :: AsyncIO" in classifiers
    assert "Topic :: Internet :: WWW/HTTP :: HTTP Servers" in classifiers
    # The rules are data the classifier reads at import: they must be in the wheel, beside the code.
    assert "crawlergate/rules/defaults.toml" in names


def test_the_sdist_holds_the_licence_changelog_guide_and_docs(dist: Path) -> None:
    sdist = _one(dist, "crawlergate-*.tar.gz")
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.removeprefix(f"{top}/") for name in tar.getnames()}
        pkg_info = tar.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None
        meta = _metadata(pkg_info.read().decode())

    for wanted in ("LICENSE", "CHANGELOG.md", "CONTRIBUTING.md", "README.md", "mkdocs.yml", "docs/index.md"):
        assert wanted in names, f"{wanted} missing from the sdist"
    assert meta["License-Expression"] == "MIT"


def test_the_wheel_installs_into_a_fresh_venv_and_runs_from_there(dist: Path, tmp_path: Path) -> None:
    wheel = _one(dist, "crawlergate-*.whl")
    fresh = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", fresh], cwd=tmp_path)
    _run([fresh / "bin" / "pip", "install", "--quiet", "--no-deps", "--no-index", wheel], cwd=tmp_path)

    # The dependencies: the running venv's site-packages, worked out here, named in a .pth of the fresh one.
    ours = {Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
    fresh_site = Path(
        _run(
            [fresh / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path
        ).strip()
    )
    assert fresh_site.is_relative_to(fresh)
    (fresh_site / "zz-crawlergate-test-deps.pth").write_text("".join(f"{path}\n" for path in sorted(ours)))

    # cwd is the temporary folder, never the checkout, so '' on sys.path cannot find the checkout's package.
    where = _run([fresh / "bin" / "python", "-c", "import crawlergate; print(crawlergate.__file__)"], tmp_path)
    assert Path(where.strip()).resolve().is_relative_to(fresh.resolve()), where

    usage = _run([fresh / "bin" / "crawlergate", "demo", "--help"], tmp_path)
    assert "usage: crawlergate demo" in usage

    # The installed package finds its rules: the classifier reads them from inside the wheel's install.
    googlebot = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"
    verdict = _run([fresh / "bin" / "crawlergate", "classify", googlebot], tmp_path)
    assert verdict.startswith("crawler\t"), verdict

    # What `pip show` and other tools read back: the installed dist-info, found first in the fresh venv.
    # (The venv's own pip, from ensurepip, may be too old to print License-Expression itself.)
    query = (
        "import importlib.metadata as m; d = m.distribution('crawlergate');"
        "print(d.metadata['License-Expression']); print(d.locate_file(''))"
    )
    licence, location = _run([fresh / "bin" / "python", "-c", query], tmp_path).splitlines()
    assert licence == "MIT"
    assert Path(location).resolve() == fresh_site.resolve()
