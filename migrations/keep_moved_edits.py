"""Keep the user's edits to the template's modules that v0.5.0 moves, which `copier update` would
otherwise delete with the old file.

Copier runs this as a migration (see `_migrations` in copier.yml) in the project's directory,
before it merges. It renders the template version the project was last generated or updated
from, with the project's answers, and renames each moved file that differs from that rendering
to `<name>.edited`, printing one line that says where the template's new copy is. The update then
writes the new modules; the user carries their changes over and deletes the `.edited` file.
"""

import sys
import tempfile
from pathlib import Path

import copier
import yaml

# Copier's checkout of the template at the version being updated to; it holds every release.
TEMPLATE = Path(__file__).resolve().parents[1]
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
    config = yaml.safe_load((TEMPLATE / "copier.yml").read_text(encoding="utf-8"))
    stored = yaml.safe_load(Path(config["_answers_file"]).read_text(encoding="utf-8"))
    answers = {key: value for key, value in stored.items() if not key.startswith("_")}
    package = Path("src") / stored["package_name"]
    present = {old: new for old, new in MOVED.items() if (package / old).is_file()}
    if not present:
        return
    with tempfile.TemporaryDirectory() as old:
        try:
            copier.run_copy(
                str(TEMPLATE),
                old,
                data=answers,
                vcs_ref=stored["_commit"],
                defaults=True,
                quiet=True,
                skip_tasks=True,
            )
        except Exception as error:
            sys.exit(f"keep_moved_edits: cannot render template version {stored['_commit']}: {error!r}")
        for name, new in present.items():
            mine, rendered = package / name, Path(old) / package / name
            if rendered.is_file() and mine.read_bytes() == rendered.read_bytes():
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
