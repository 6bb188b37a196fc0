"""Let `copier update` refresh the user-owned files that the user never edited.

Copier runs this as a migration (see `_migrations` in copier.yml) in the project's directory,
before it merges. An update never touches an existing file matched by `_skip_if_exists`. This
script renders the template version the project was last generated or updated from, with the
project's answers, and deletes every such file that is still byte-identical to that rendering;
the update then writes the new version's copy in its place. Files the user edited stay as they are.
"""

import sys
import tempfile
from pathlib import Path

import copier
import jinja2
import yaml
from pathspec import GitIgnoreSpec

# Copier's checkout of the template at the version being updated to; it holds every release.
TEMPLATE = Path(__file__).resolve().parents[1]


def main() -> None:
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    stored = yaml.safe_load(Path(config["_answers_file"]).read_text(encoding="utf-8"))
    answers = {key: value for key, value in stored.items() if not key.startswith("_")}
    patterns = [jinja2.Template(pattern).render(answers) for pattern in config["_skip_if_exists"]]
    user_owned = GitIgnoreSpec.from_lines(patterns)
    version = stored["_commit"]
    with tempfile.TemporaryDirectory() as old:
        try:
            copier.run_copy(
                str(TEMPLATE), old, data=answers, vcs_ref=version, defaults=True, quiet=True, skip_tasks=True
            )
        except Exception as error:
            sys.exit(f"refresh_unedited: cannot render template version {version}: {error!r}")
        for rendered in Path(old).rglob("*"):
            name = rendered.relative_to(old).as_posix()
            mine = Path(name)
            if (
                user_owned.match_file(name)
                and rendered.is_file()
                and mine.is_file()
                and mine.read_bytes() == rendered.read_bytes()
            ):
                mine.unlink()


if __name__ == "__main__":
    main()
