"""What the migrations share: the project's answers, and the template release that the project was
last generated or updated from, rendered with them.

Copier runs each migration in the project's directory, with the template checked out at the
version being updated to; that checkout holds every release.
"""

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import copier
import yaml

TEMPLATE = Path(__file__).resolve().parents[1]


def copier_config() -> dict[str, Any]:
    return yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))


def stored_answers() -> dict[str, Any]:
    """The project's answers file: the answers, and ``_commit``, the release it was made from."""
    return yaml.safe_load(Path(copier_config()["_answers_file"]).read_text(encoding="utf-8"))


def answers(stored: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in stored.items() if not key.startswith("_")}


@contextlib.contextmanager
def rendered(migration: str, stored: dict[str, Any], release: str | None = None) -> Iterator[Path]:
    """A temporary directory holding the project as ``release`` writes it with the project's answers:
    by default the release the project was last generated or updated from, before any edit;
    ``"HEAD"``, the release being updated to."""
    release = release or stored["_commit"]
    with tempfile.TemporaryDirectory() as old:
        try:
            copier.run_copy(
                str(TEMPLATE),
                old,
                data=answers(stored),
                vcs_ref=release,
                defaults=True,
                quiet=True,
                skip_tasks=True,
            )
        except Exception as error:
            sys.exit(f"{migration}: cannot render template version {release}: {error!r}")
        yield Path(old)
