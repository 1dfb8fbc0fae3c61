"""The reference pages, generated: every setting from the settings definitions in ``crawlergate/config.py`` (its
type, default, environment variable, flag and the comment written above it), and every command from the real
argument parser, so neither can drift from the code.

MkDocs loads this file as a hook (``mkdocs.yml``) and builds the site from the pages as generated. A copy is
kept in docs/reference/ so the pages read on a repository's web view too; ``tests/test_docs.py`` fails when the
copy is behind, and ``python docs/hooks/reference.py`` writes it again.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import inspect
import io
import os
import re
import tokenize
import typing
from pathlib import Path
from typing import Any

from crawlergate import config
from crawlergate.cli import _parser

SETTINGS_PAGE = "reference/settings.md"
COMMANDS_PAGE = "reference/commands.md"


@dataclasses.dataclass(frozen=True)
class Option:
    key: str
    type: str
    default: str
    variable: str
    flags: tuple[str, ...]
    description: str


def field_comments(cls: type[Any]) -> dict[str, str]:
    """The comment block written directly above each field of a settings class."""
    source = inspect.getsource(cls)
    names = {field.name for field in dataclasses.fields(cls)}
    comments: dict[str, str] = {}
    pending: list[str] = []
    previous_line = 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            if token.start[0] != previous_line + 1:
                pending = []
            pending.append(token.string.lstrip("#").strip())
            previous_line = token.start[0]
        elif token.type == tokenize.NAME and token.start[1] == 4 and token.string in names:
            if pending and previous_line == token.start[0] - 1:
                comments[token.string] = " ".join(pending)
            pending = []
            previous_line = token.start[0]
    return comments


def _size(value: int) -> str:
    """A byte count as the settings accept it: binary units when it is a round number of them, else decimal."""
    for unit, power in (("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if value % 1024**power == 0:
            return f'`"{value // 1024**power}{unit}"`'
    for unit, power in (("GB", 3), ("MB", 2), ("kB", 1)):
        if value % 1000**power == 0:
            return f'`"{value // 1000**power}{unit}"`'
    return f"`{value}`"


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f'`"{value}"`' for value in typing.get_args(annotation))
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(annotation, str(annotation))


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, tuple):
        return "`[" + ", ".join(f'"{item}"' for item in value) + "]`" if value else "`[]`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def _flags_by_setting() -> dict[str, list[str]]:
    """Each setting a command-line flag sets, as its help text names it ("(server.port, default 8080)")."""
    found: dict[str, list[str]] = {}
    for name, command in _commands():
        for action in command._actions:
            for key in re.findall(r"\b([a-z0-9]+\.[a-z_0-9]+)\b", action.help or ""):
                for flag in action.option_strings[-1:]:
                    label = f"`{name} {flag}`"
                    if label not in found.setdefault(key, []):
                        found[key].append(label)
    return found


def settings_options() -> dict[str, list[Option]]:
    """Every setting, section by section, as the reference lists it."""
    flags = _flags_by_setting()
    sections: dict[str, list[Option]] = {}
    hints_of = {cls: typing.get_type_hints(cls) for cls in (*config._SECTIONS.values(), config.SiteSettings)}
    for section, cls in (*config._SECTIONS.items(), ("sites", config.SiteSettings)):
        comments = field_comments(cls)
        hints = hints_of[cls]
        rows = []
        for field in dataclasses.fields(cls):
            if section == "sites" and field.name in config._SITE_SECTIONS:
                continue
            default = field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc]
            key = f"{section}.{field.name}"
            is_size = field.name.endswith("_bytes")
            rows.append(
                Option(
                    key=key,
                    type="size" if is_size else _type_name(hints[field.name]),
                    default=_size(default) if is_size and default else _default(default),
                    variable="" if section == "sites" else f"`CRAWLERGATE_{section.upper()}_{field.name.upper()}`",
                    flags=tuple(flags.get(key, ())),
                    description=comments.get(field.name, ""),
                )
            )
        sections[section] = rows
    return sections


def settings_page() -> str:
    lines = [
        "# Settings",
        "",
        "Every setting crawlergate reads, generated from their definitions in `crawlergate/config.py`, so they",
        "cannot drift from the code. A setting comes from the TOML file (`--config FILE`, or the file",
        "`CRAWLERGATE_CONFIG` names), then from its environment variable, then from a command-line flag: the",
        "later one wins. A size",
        "is a number of bytes or a number with a unit: `kB`, `MB`, `GB` are powers of 1000 (the paper's sizes),",
        '`KiB`, `MiB`, `GiB` powers of 1024 (`"64MiB"` is 67,108,864 bytes). Lists are TOML lists in the file and',
        "comma-separated in the environment. Every default works on a laptop. See the",
        "[configuration guide](../guides/configuration.md) for examples.",
        "",
    ]
    for section, options in settings_options().items():
        cls = config.SiteSettings if section == "sites" else config._SECTIONS[section]
        title = "[[sites]]" if section == "sites" else f"[{section}]"
        lines += [f"## `{title}`", "", inspect.getdoc(cls) or "", ""]
        if section == "sites":
            lines += [
                "Each `[[sites]]` table may also hold its own `[sites.cache]`, `[sites.regenerate]`, `[sites.policy]`,",
                "`[sites.evidence]` and `[sites.valve]`, with the keys of those sections.",
                "",
            ]
        lines += ["| setting | type | default | environment, flag | what it does |", "|---|---|---|---|---|"]
        for option in options:
            where = "<br>".join(filter(None, [option.variable, *option.flags])) or "—"
            text = html.escape(option.description, quote=False).replace("|", "\\|")
            lines.append(f"| `{option.key}` | {option.type} | {option.default} | {where} | {text} |")
        lines.append("")
    return "\n".join(lines)


def _commands() -> list[tuple[str, argparse.ArgumentParser]]:
    parser = _parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [(f"crawlergate {name}", command) for name, command in subparsers.choices.items()]


def command_names() -> list[str]:
    return [name for name, _ in _commands()]


def commands_page() -> str:
    lines = [
        "# Commands",
        "",
        "Every `crawlergate` command with its `--help`, generated from the argument parser, so it cannot",
        "drift. Commands that take settings read them from `--config FILE` and `CRAWLERGATE_*` variables too",
        "(see [Settings](settings.md)).",
        "",
    ]
    # argparse wraps help to the terminal's width: a fixed one keeps the page the same on every machine.
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        for name, command in _commands():
            command.prog = name
            summary = (command.description or "").strip().splitlines()
            help_text = command.format_help().rstrip()
            lines += [f"## `{name}`", "", summary[0] if summary else "", "", "```text", help_text, "```", ""]
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(lines)


def generated_pages() -> dict[str, str]:
    """The generated pages by their path under docs/."""
    return {SETTINGS_PAGE: settings_page(), COMMANDS_PAGE: commands_page()}


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: the site takes the pages as generated now, whatever the copy in docs/reference/ holds."""
    from mkdocs.structure.files import File

    for path, text in generated_pages().items():
        stale = files.get_file_from_path(path)
        if stale is not None:
            files.remove(stale)
        files.append(File.generated(config, path, content=text))
    return files


if __name__ == "__main__":
    docs = Path(__file__).resolve().parent.parent
    for path, text in generated_pages().items():
        (docs / path).write_text(text, encoding="utf-8")
        print(f"wrote docs/{path}")
