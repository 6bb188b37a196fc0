"""Let `copier update` refresh the user-owned files that the user never edited.

Copier runs this as a migration (see `_migrations` in copier.yml) in the project's directory,
before it merges. An update never touches an existing file matched by `_skip_if_exists`. This
script renders the template version the project was last generated or updated from, with the
project's answers, and deletes every such file that is still byte-identical to that rendering;
the update then writes the new version's copy in its place. Files the user edited stay as they are.
"""

from pathlib import Path

import jinja2
from last_release import answers, copier_config, rendered, stored_answers
from pathspec import GitIgnoreSpec


def main() -> None:
    stored = stored_answers()
    patterns = [
        jinja2.Template(pattern).render(answers(stored)) for pattern in copier_config()["_skip_if_exists"]
    ]
    user_owned = GitIgnoreSpec.from_lines(patterns)
    with rendered("refresh_unedited", stored) as old:
        for path in old.rglob("*"):
            name = path.relative_to(old).as_posix()
            mine = Path(name)
            if (
                user_owned.match_file(name)
                and path.is_file()
                and mine.is_file()
                and mine.read_bytes() == path.read_bytes()
            ):
                mine.unlink()


if __name__ == "__main__":
    main()
