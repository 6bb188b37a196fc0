"""Keep the user's edits to the template's modules that v0.5.0 moves, which `copier update` would
otherwise delete with the old file.

Copier runs this as a migration (see `_migrations` in copier.yml) in the project's directory,
before it merges. It renders the template version the project was last generated or updated
from, with the project's answers, and renames each moved file that differs from that rendering
to `<name>.edited`, printing one line that says where the template's new copy is. The update then
writes the new modules; the user carries their changes over and deletes the `.edited` file.
"""

import sys
from pathlib import Path

from last_release import rendered, stored_answers

# Where v0.5.0 moved each module of the package (paths inside src/<package>/).
MOVED = {
    "utils/runs.py": "runs/directory.py",
    "utils/record.py": "runs/record.py",
    "utils/summary.py": "runs/summary.py",
    "utils/interrupts.py": "runs/interrupts.py",
    "utils/checkpointing.py": "runs/checkpoints.py",
    "utils/sweep_trial.py": "sweeps/trial.py",
}


def main() -> None:
    stored = stored_answers()
    package = Path("src") / stored["package_name"]
    present = {old: new for old, new in MOVED.items() if (package / old).is_file()}
    if not present:
        return
    with rendered("keep_moved_edits", stored) as old:
        for name, new in present.items():
            mine, release = package / name, old / package / name
            if release.is_file() and mine.read_bytes() == release.read_bytes():
                continue
            kept = mine.with_name(mine.name + ".edited")
            mine.rename(kept)
            print(
                f"note: {mine} moved to {package / new} in v0.5.0; your edited version is kept as {kept}: "
                "carry your changes over to the new file, then delete it",
                file=sys.stderr,
            )


if __name__ == "__main__":
    main()
