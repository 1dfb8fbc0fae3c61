"""The README's commands are true: each complete ``crawlergate …`` line it shows parses with the real parser."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from crawlergate.cli import _parser

README = Path(__file__).parent.parent / "README.md"


def _command_lines() -> list[str]:
    """Commands in the README's sh blocks and in inline code with flags; a synopsis counts without its
    [optional] parts (lines left with ``a | b`` choices are skipped)."""
    text = README.read_text(encoding="utf-8")
    lines, joined = [], ""
    blocks = re.findall(r"```sh\n(.*?)```", text, re.DOTALL) + re.findall(r"`(crawlergate [^`\n]* --[^`\n]+)`", text)
    for block in blocks:
        for line in block.splitlines():
            joined += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
            if line.endswith("\\"):
                continue
            command, joined = joined.split("#")[0].strip(), ""
            command = re.sub(r"^\$ |^\.venv/bin/", "", command)
            while re.search(r"\[[^\[\]]*\]", command):
                command = re.sub(r"\s*\[[^\[\]]*\]", "", command)
            if command.startswith("crawlergate ") and not re.search(r"[\[\]|…]|\.\.\.", command):
                lines.append(command)
    return list(dict.fromkeys(lines))


def test_readme_shows_commands() -> None:
    assert len(_command_lines()) >= 12


@pytest.mark.parametrize("line", _command_lines())
def test_readme_command_parses_as_written(line: str) -> None:
    parser = _parser()
    parser.exit_on_error = False
    args = parser.parse_args(shlex.split(line)[1:])
    assert args.command is not None
