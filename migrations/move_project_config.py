"""Move the user's model and data out of `configs/default.yaml` into `configs/project.yaml` (v0.6.0).

From v0.6.0, the template's `configs/default.yaml` holds the seed, the Trainer and the
checkpoints, and `configs/project.yaml`, the user's own file, the model and the data. Copier runs
this as a migration (see `_migrations` in copier.yml) in the project's directory, before it
merges. Where the project's `model:` and `data:` sections differ from those of the release it was
last generated or updated from (the user changed them), it writes `configs/project.yaml` as the
new release has it with the user's changes merged in, as an update merges a template file
(conflicts marked inline), and puts the release's sections back in `default.yaml`. It stages both
files, so that the update keeps `project.yaml` as it is and takes the sections out of
`default.yaml` as it would for a project that never changed them. Sections
left as the release wrote them stay, and the update writes the new release's `project.yaml`.
"""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from last_release import rendered, stored_answers

CONFIGS = Path("configs")
DEFAULT, PROJECT = CONFIGS / "default.yaml", CONFIGS / "project.yaml"
MOVED = ("model", "data")
TOP_LEVEL_KEY = re.compile(r"([A-Za-z_][\w-]*):")


def sections(text: str) -> list[tuple[str | None, str]]:
    """The YAML text's top-level sections, in order: each key with its lines, the comment lines
    right above the key included (a blank line between them ends the comment's tie to the key);
    None for what comes before the first key."""
    found, key, lines, above = [], None, [], []
    for line in text.splitlines(keepends=True):
        if match := TOP_LEVEL_KEY.match(line):
            found.append((key, "".join(lines)))
            key, lines, above = match.group(1), [*above, line], []
        elif line.startswith("#"):
            above.append(line)
        elif not line.strip():
            lines, above = [*lines, *above, line], []
        else:
            lines, above = [*lines, *above, line], []
    found.append((key, "".join(lines + above)))
    return found


def moved(text: str) -> str:
    return "".join(part for key, part in sections(text) if key in MOVED).strip("\n") + "\n"


def merged(mine: str, base: str, theirs: str) -> tuple[str, bool]:
    """``theirs`` with the changes from ``base`` to ``mine``, and whether some conflicted, marked as
    `copier update` marks them."""
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder, name) for name in ("mine", "base", "theirs")]
        for path, text in zip(paths, (mine, base, theirs), strict=True):
            path.write_text(text, encoding="utf-8")
        labels = ["-L", "before updating", "-L", "last update", "-L", "after updating"]
        done = subprocess.run(
            ["git", "merge-file", "-p", *labels, *map(str, paths)], capture_output=True, text=True, timeout=60
        )
    if done.returncode < 0 or done.returncode > 127:
        sys.exit(f"move_project_config: git merge-file failed: {done.stderr.strip()}")
    return done.stdout, done.returncode > 0


def main() -> None:
    if PROJECT.exists() or not DEFAULT.is_file():
        return
    mine = DEFAULT.read_text(encoding="utf-8")
    stored = stored_answers()
    with rendered("move_project_config", stored) as old:
        release = (old / DEFAULT).read_text(encoding="utf-8")
    base = moved(release)
    if moved(mine) == "\n" or moved(mine) == base:
        return  # as the release wrote them: the update writes the new release's project.yaml
    with rendered("move_project_config", stored, release="HEAD") as new:
        theirs = (new / PROJECT).read_text(encoding="utf-8")
    head = sections(theirs)[0][1]  # the comment that opens the file
    text, conflicted = merged(moved(mine), base, moved(theirs))
    PROJECT.write_text(head + text, encoding="utf-8")
    # default.yaml with the sections as the release wrote them: the update then takes them out as
    # it takes out those of a project that never changed them, and merges the rest.
    released = dict(sections(release))
    restored = (released[key] if key in MOVED and key in released else part for key, part in sections(mine))
    DEFAULT.write_text("".join(restored), encoding="utf-8")
    subprocess.run(["git", "add", "--", str(DEFAULT), str(PROJECT)], check=True, timeout=60)
    print(
        f"note: your model and data settings moved from {DEFAULT} to {PROJECT}, which is yours from "
        "v0.6.0 (copier update never changes it)"
        + ("; resolve the conflicts marked in it" if conflicted else ""),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
