"""The experiment record's file, ``experiments.jsonl``: one JSON object per line, appended and read
back. Imports nothing heavy, so that scripts read it without Lightning."""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

RECORD_FILE = Path("experiments.jsonl")


def append_line(path: Path, line: dict[str, Any]) -> None:
    """Append ``line`` to the record, on a line of its own even after a last line that lacks its
    newline (cut short by a crash, or edited by hand), which would otherwise take this one in."""
    with path.open("a+b") as file:
        file.seek(max(file.seek(0, os.SEEK_END) - 1, 0))
        cut_short = file.read(1) not in (b"", b"\n")
        # One write, which appends whole even beside another process's (a sweep's workers).
        file.write(b"\n" * cut_short + json.dumps(line, default=str).encode() + b"\n")


def read_lines(
    path: Path,
    since: int = 0,
    skipped: Callable[[int, str], None] | None = None,
    check: Callable[[dict[str, Any]], str | None] | None = None,
) -> list[dict[str, Any]]:
    """The lines of the record after its first ``since`` bytes that are JSON objects, and that
    ``check``, if given, finds nothing wrong with. Each other non-blank line (cut short by a
    crash, or edited by hand) is left out, and given to ``skipped`` with its number (counted from
    ``since``) and what is wrong with it."""
    with path.open("rb") as file:
        file.seek(since)
        data = file.read()
    lines = []
    for number, text in enumerate(data.splitlines(), start=1):
        try:
            line = json.loads(text.decode())
            problem = None if isinstance(line, dict) else "is not a JSON object"
        except UnicodeDecodeError as error:
            problem = f"is not UTF-8 text (byte {error.start + 1}: {error.reason})"
        except json.JSONDecodeError as error:
            problem = f"is not JSON (column {error.colno}: {error.msg})"
        if problem is None and check is not None:
            problem = check(line)
        if problem is None:
            lines.append(line)
        elif text.strip() and skipped is not None:
            skipped(number, problem)
    return lines
