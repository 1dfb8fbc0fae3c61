"""The documentation cannot drift from the code: the reference pages the site builds from the settings
definitions and the argument parser list every setting (each with a description) and every command, and the
design document the docstrings cite is in the repository."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

from crawlergate import config
from crawlergate.cli import _parser

ROOT = Path(__file__).parent.parent


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _every_setting() -> list[str]:
    keys = [f"{name}.{f.name}" for name, cls in config._SECTIONS.items() for f in dataclasses.fields(cls)]
    return keys + [
        f"sites.{f.name}" for f in dataclasses.fields(config.SiteSettings) if f.name not in config._SITE_SECTIONS
    ]


def test_every_setting_has_a_description() -> None:
    options = [option for section in _reference().settings_options().values() for option in section]
    assert [option.key for option in options] == _every_setting()
    assert [option.key for option in options if len(option.description) < 10] == []


def test_the_settings_page_lists_every_setting_with_its_variable_and_default() -> None:
    page = _reference().settings_page()
    for key in _every_setting():
        assert f"| `{key}` |" in page, key
    assert "`CRAWLERGATE_SERVER_PUBLIC_URL`" in page and "`crawlergate serve --public-url`" in page
    assert '| `l2.max_bytes` | size | `"1GiB"` |' in page


def test_the_commands_page_shows_every_command_with_its_help() -> None:
    page = _reference().commands_page()
    subcommands = next(a for a in _parser()._actions if a.dest == "command").choices
    for name in subcommands:
        assert f"## `crawlergate {name}`" in page
        assert f"usage: crawlergate {name}" in page
    assert len(subcommands) >= 14


def test_the_design_the_docstrings_cite_is_in_the_repository() -> None:
    design = (ROOT / "docs" / "design" / "index.md").read_text()
    assert "## The request, end to end" in design and "## Contracts" in design
    cited = [path for path in (ROOT / "crawlergate").rglob("*.py") if re.search(r"DESIGN(\.md)?\b", path.read_text())]
    assert cited == []


def test_every_page_of_the_site_is_in_its_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {path.relative_to(ROOT / "docs").as_posix() for path in (ROOT / "docs").rglob("*.md")}
    generated = {"reference/settings.md", "reference/commands.md"}
    assert {page for page in pages if f": {page}" not in nav} == set()
    assert all(f": {page}" in nav for page in generated)


def test_every_configuration_file_the_docs_show_loads(tmp_path: Path) -> None:
    shown = 0
    for page in (ROOT / "docs").rglob("*.md"):
        for block in re.findall(r"```toml\n(.*?)```", page.read_text(), re.DOTALL):
            if not set(tomllib.loads(block)) <= {*config._SECTIONS, "sites"}:
                continue  # a rules file, not settings
            (tmp_path / "shown.toml").write_text(block)
            config.load_settings(tmp_path / "shown.toml", {})
            shown += 1
    assert shown >= 4


def test_the_copy_of_the_generated_pages_is_up_to_date() -> None:
    for path, text in _reference().generated_pages().items():
        copy = (ROOT / "docs" / path).read_text(encoding="utf-8")
        assert copy == text, f"docs/{path} is behind the code: run `python docs/hooks/reference.py`"
