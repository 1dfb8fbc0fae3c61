"""The package keeps its two halves apart (docs/design/index.md, "The house"), read from the import statements."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "crawlergate"
# Modules both halves may use.
SHARED = {"crawlergate", "crawlergate.errors", "crawlergate.config", "crawlergate.metrics", "crawlergate.rules"}
SHARED |= {"crawlergate.classify", "crawlergate.keys", "crawlergate.page"}
LIVE_GATE = ("gate", "adapters", "admin", "stores", "regenerate", "cache.py", "wiring.py")


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("crawlergate"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("crawlergate"))
    return found


def _files(*names: str) -> list[Path]:
    files: list[Path] = []
    for name in names:
        target = PACKAGE / name
        files += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return files


@pytest.mark.parametrize("path", _files(*LIVE_GATE), ids=lambda path: _module(path))
def test_layout_the_live_gate_never_imports_the_tools(path: Path) -> None:
    offline = {name for name in _imports(path) if name.split(".")[1:2] in (["tools"], ["demo"], ["cli"])}
    assert not offline, f"{_module(path)} imports {sorted(offline)}"


@pytest.mark.parametrize("path", _files("tools"), ids=lambda path: _module(path))
def test_layout_the_tools_take_only_the_shared_modules_from_the_gate(path: Path) -> None:
    outside = {name for name in _imports(path) if not name.startswith("crawlergate.tools") and name not in SHARED}
    assert not outside, f"{_module(path)} imports {sorted(outside)}"


def test_layout_the_schedule_and_its_window_are_the_only_apscheduler_imports() -> None:
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if any(name.split(".")[0] == "apscheduler" for name in names):
                importers.add(_module(path))
    assert importers == {"crawlergate.regenerate.schedule", "crawlergate.regenerate.window"}


@pytest.mark.parametrize("path", _files("gate"), ids=lambda path: _module(path))
def test_layout_the_live_gate_never_imports_the_admin_endpoints(path: Path) -> None:
    admin = {name for name in _imports(path) if name.startswith("crawlergate.admin")}
    assert not admin, f"{_module(path)} imports {sorted(admin)}: wiring.py builds the admin endpoints"


def _all_imports(path: Path) -> set[str]:
    """Every module ``path`` imports, ours and others', at any depth of the file (TYPE_CHECKING blocks too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", _files("gate"), ids=lambda path: _module(path))
def test_layout_the_live_gate_imports_no_interface(path: Path) -> None:
    interfaces = {
        name
        for name in _all_imports(path)
        if name.split(".")[0] in ("starlette", "uvicorn", "wsgiref") or "wsgi" in name.split(".")[-1]
    }
    assert not interfaces, f"{_module(path)} imports {sorted(interfaces)}: interfaces belong in adapters/"


@pytest.mark.parametrize("name", ["fill", "storable", "invalidate"])
def test_layout_fill_storage_and_invalidation_never_import_the_engine(name: str) -> None:
    assert "crawlergate.gate.engine" not in _imports(PACKAGE / "gate" / f"{name}.py")


def test_layout_the_flow_does_no_io_of_its_own() -> None:
    """The flow asks its adapter for every lookup, fill and disk read: no thread, event loop or socket module."""
    io_modules = {"anyio", "asyncio", "threading", "socket", "concurrent.futures", "httpx", "sqlite3"}
    assert not _all_imports(PACKAGE / "gate" / "flow.py") & io_modules


ADAPTERS = ("adapters/asgi.py", "adapters/wsgi.py", "adapters/proxy.py")
# The ASGI and WSGI adapters' code lines (no docstrings, comments or blank lines) when each wrote the crawler
# sequence out (commit a8a8c68): 297 + 322. One flow keeps them, with their shared base, at most 60 % of that.
CODE_LINES_BEFORE_THE_FLOW = 619


def _code_lines(path: Path) -> list[str]:
    """The lines that hold code, stripped: docstrings, comments and blank lines left out."""
    source = path.read_text()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    lines = source.splitlines()
    return [
        line.strip()
        for number, line in enumerate(lines, start=1)
        if number not in docstrings and line.strip() and not line.strip().startswith("#")
    ]


def test_layout_the_adapters_repeat_no_run_of_six_lines() -> None:
    """The crawler sequence lives in gate/flow.py once: no six code lines in a row are the same in two adapters."""
    runs: dict[tuple[str, ...], str] = {}
    for name in ADAPTERS:
        lines = _code_lines(PACKAGE / name)
        for start in range(len(lines) - 5):
            run = tuple(lines[start : start + 6])
            if any(line.startswith(("from ", "import ")) for line in run):
                continue
            seen = runs.setdefault(run, name)
            assert seen == name, f"{name} repeats six lines of {seen}: {run}"


def test_layout_the_adapters_hold_at_most_60_percent_of_what_they_did() -> None:
    files = ("adapters/asgi.py", "adapters/wsgi.py", "adapters/base.py")
    code = sum(len(_code_lines(PACKAGE / name)) for name in files)
    assert code <= 0.6 * CODE_LINES_BEFORE_THE_FLOW, f"{code} code lines in {files}"
