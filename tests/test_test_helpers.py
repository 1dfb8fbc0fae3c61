"""The tests' own house rules: every visitor a test sends (crawler, person, suspect) is defined once, in
tests/visitors.py, and every test module opens with a docstring saying what it proves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
VISITORS = TESTS / "visitors.py"
# A user agent: a browser's (and most crawlers' own) "Mozilla/…", a name ending in bot, spider or crawler, or
# the "name/version (+URL)" a fetcher signs with.
AGENT = re.compile(r"Mozilla/\d|\w(?:bot|spider|crawler)\b|^[\w.-]+/[\d.]+ \(\+https?://", re.IGNORECASE)
# The request headers only a visitor sends: a dict keyed by one, or a header line of one, is a visitor's headers.
VISITOR_HEADER = re.compile(r"user-agent|accept-language|upgrade-insecure-requests|sec-fetch-.*|sec-ch-ua.*", re.I)
# Calls whose literals are cases or patterns, not visitors: a parametrize table's rows, a regular expression.
NOT_VISITORS = {"pytest.param", "re.compile"}


def _text(node: ast.AST | None) -> str | None:
    """A literal's text, stripped; None for anything else and for a text of several lines (a config, a page)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        text = (node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value).strip()
        return text if len(text.splitlines()) <= 1 else None
    return None


def _is_visitor(node: ast.AST) -> bool:
    """Whether ``node`` holds a user agent or a visitor's request header, outside ``NOT_VISITORS`` calls."""
    if isinstance(node, ast.Call) and ast.unparse(node.func) in NOT_VISITORS:
        return False
    text = _text(node)
    if text is not None and (AGENT.search(text) or VISITOR_HEADER.fullmatch(text.split(":", 1)[0]) and ":" in text):
        return True
    if isinstance(node, ast.Dict) and any(
        (key_text := _text(key)) is not None and VISITOR_HEADER.fullmatch(key_text) for key in node.keys
    ):
        return True
    return any(_is_visitor(child) for child in ast.iter_child_nodes(node))


def visitor_constants(source: str) -> list[str]:
    """The module-level names of ``source`` assigned a user agent or a visitor's request headers."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None and _is_visitor(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [ast.unparse(target) for target in targets]
    return found


@pytest.mark.parametrize(
    ("source", "found"),
    [
        pytest.param('GOOGLEBOT = "Mozilla/5.0 (compatible; Googlebot/2.1)"', ["GOOGLEBOT"], id="crawler-ua"),
        pytest.param('BOT = {"user-agent": "Googlebot/2.1"}', ["BOT"], id="crawler-headers"),
        pytest.param('BROWSER: str = "Mozilla/5.0 (X11; rv:133.0) Firefox/133.0"', ["BROWSER"], id="browser-ua"),
        pytest.param('FEED = "Miniflux/2.2.0 (+https://miniflux.app)"', ["FEED"], id="fetcher-ua"),
        pytest.param("PREVIEWS = ('Slackbot-LinkExpanding 1.0',)", ["PREVIEWS"], id="bot-name"),
        pytest.param('NAVIGATION = {"accept": "*/*", "sec-fetch-mode": "navigate"}', ["NAVIGATION"], id="navigation"),
        pytest.param('HEAD = b"User-Agent: curl/8.5.0\\r\\n"', ["HEAD"], id="header-line"),
        pytest.param('AS_CHROME = {"User-Agent": CHROME_UA, "Accept": "*/*"}', ["AS_CHROME"], id="borrowed-ua"),
        # What is allowed: inline agents in a test, tables of cases, patterns, texts, other headers.
        pytest.param('def test():\n    ua = "Mozilla/5.0 (compatible; Googlebot/2.1)"', [], id="inside-a-test"),
        pytest.param('TABLE = [pytest.param("Googlebot/2.1", "crawler")]', [], id="parametrize-table"),
        pytest.param('GRAMMAR = re.compile(r"Mozilla/5\\.0 \\(")', [], id="pattern"),
        pytest.param('POLICY = """\n[family]\nBytespider = "deny"\n"""', [], id="config-text"),
        pytest.param('PAGE = {"content-type": "text/html", "vary": "User-Agent"}', [], id="response-headers"),
        pytest.param('ROBOTS = "/robots.txt"\nGATE = "crawlergate"', [], id="robots-and-crawlergate"),
    ],
)  # fmt: skip
def test_helpers_what_counts_as_a_visitor_constant(source: str, found: list[str]) -> None:
    assert visitor_constants(source) == found


def _modules() -> list[Path]:
    return [path for path in sorted(TESTS.rglob("*.py")) if path != VISITORS]


@pytest.mark.parametrize("path", _modules(), ids=lambda path: str(path.relative_to(TESTS)))
def test_helpers_visitors_are_defined_only_in_visitors_py(path: Path) -> None:
    """Inline agents inside a test are fine (a test about that string); a module's own visitor constant is not."""
    found = visitor_constants(path.read_text(encoding="utf-8"))
    assert not found, f"{path.name} defines {found}: take them from tests/visitors.py (add a named variant there)"


def _test_modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


@pytest.mark.parametrize("path", _test_modules(), ids=lambda path: str(path.relative_to(TESTS)))
def test_helpers_every_test_module_says_what_it_proves(path: Path) -> None:
    assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))), f"{path.name} has no module docstring"
