"""docs/errors.md, the catalogue of the errors a generated project prints, checked against the
template's code and its tests, by reading them (nothing is generated or run):

- every error message in the code is in the catalogue;
- every message in the catalogue is asserted by a test of the generated project.

Messages are compared by their fixed text. A placeholder in the catalogue (``<path>``) and a
replacement field in the code (``{path}``) stand for any text, and the fixed parts around them
must all appear, in order, in the one message they are compared with.
"""

import ast
import re
from pathlib import Path

from conftest import ROOT

CATALOGUE = ROOT / "docs" / "errors.md"
TEMPLATE = ROOT / "template"
SOURCES = sorted([*(TEMPLATE / "src").rglob("*.py*"), *(TEMPLATE / "scripts").glob("*.py*")])
# Conditional files too: "{% if task != 'regression' %}test_streaming.py{% endif %}.jinja".
TESTS = sorted((TEMPLATE / "tests").rglob("*test_*.py*"))
ANY = "\0"  # what a replacement field or a placeholder becomes
# Exceptions whose message the CLI or a script prints as an error line.
RAISED = re.compile(r"\w*Error")
# The first cell of a catalogue row: a code span, with one backtick or two.
ENTRY = re.compile(r"^\| (`+) ?(.+?) ?\1 \|", re.MULTILINE)
PLACEHOLDER = re.compile(r"<[^<>\s][^<>]*>")
# What a parser or a script puts before its message: ``error: ``, or ``<script>.py: error: ``.
PREFIX = re.compile(r"^(?:[\w-]+\.py: )?error: ")


def _python(path: Path) -> ast.Module:
    """A template file as Python: each Jinja expression (the package name) filled in and lines of
    Jinja tags dropped."""
    lines = re.sub(r"\{\{.*?\}\}", "my_project", path.read_text()).splitlines()
    return ast.parse("\n".join(line for line in lines if not line.lstrip().startswith("{%")), str(path))


def _text(node: ast.AST) -> str | None:
    """The text of a string expression, with ``ANY`` for each part computed at run time; ``None``
    when the whole message is computed (a name, a call: the message is made elsewhere)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else ANY for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None and right is None else (left or ANY) + (right or ANY)
    return None


def _messages(tree: ast.Module) -> list[str]:
    """The error messages of a module: what it passes to ``parser.error``, raises as an exception
    with a message, or writes as a line that starts with ``error: ``."""
    found = set()
    parts = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parser_error = isinstance(node.func, ast.Attribute) and node.func.attr == "error"
            exception = isinstance(node.func, ast.Name) and RAISED.fullmatch(node.func.id)
            if parser_error or exception:
                found |= {text for argument in node.args if (text := _text(argument)) and _fragments(text)}
        elif id(node) not in parts and (_text(node) or "").startswith("error: "):
            found.add(_text(node))
    return sorted(found)


def _fragments(text: str) -> list[str]:
    """The fixed parts of a message, between the parts that stand for any text (without the spaces
    at their ends, which a test's expected text may leave out)."""
    return [part.strip() for part in PLACEHOLDER.sub(ANY, text).split(ANY) if part.strip()]


def _contains(text: str, fragments: list[str]) -> bool:
    return re.search(".*?".join(map(re.escape, fragments)), text, re.DOTALL) is not None


def catalogue() -> list[str]:
    """The messages of docs/errors.md: the first cell of each row of its tables."""
    return [message for _, message in ENTRY.findall(CATALOGUE.read_text())]


def test_every_error_in_the_code_is_in_the_catalogue():
    entries = catalogue()
    missing = [
        f"{path.relative_to(TEMPLATE)}: {message.replace(ANY, '{…}')}"
        for path in SOURCES
        for message in _messages(_python(path))
        if not any(_contains(entry, _fragments(message)) for entry in entries)
    ]
    assert not missing, "not in docs/errors.md:\n" + "\n".join(missing)


def test_every_catalogue_entry_is_asserted_by_a_test():
    # The strings of the tests, also with regular expressions' escapes undone (``\(`` is ``(``).
    strings = {
        text
        for path in TESTS
        for node in ast.walk(_python(path))
        if isinstance(node, ast.Constant | ast.JoinedStr) and (text := _text(node))
    }
    strings |= {re.sub(r"\\(.)", r"\1", text) for text in strings}
    untested = [
        entry
        for entry in catalogue()
        if not any(_contains(text, _fragments(PREFIX.sub("", entry))) for text in strings)
    ]
    assert not untested, "asserted by no test in template/tests:\n" + "\n".join(untested)


def test_the_catalogue_is_read_whole():
    # A row whose message the pattern misses would escape both checks.
    rows = [line for line in CATALOGUE.read_text().splitlines() if line.startswith("| `")]
    assert len(catalogue()) == len(rows) > 50
