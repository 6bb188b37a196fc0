"""Keep the user's edits to the template's files that a release moves, which `copier update` would
otherwise delete with the old file.

Copier runs this as a migration (see `_migrations` in copier.yml) once for each release that moved
files, named as the argument (`keep_moved_edits.py v0.17.0`), in the project's directory, before
it merges. It renders the template version the project was last generated or updated from, with
the project's answers, and renames each moved file that differs from that rendering to
`<name>.edited`, printing one line that says where the template's new copy is. The update then
writes the new files; the user carries their changes over and deletes the `.edited` file.
"""

import sys
from pathlib import Path

from last_release import rendered, stored_answers

SRC, FRAMEWORK = "src/{package}", "src/{package}/framework"


def _moved(old: str, new: str, names: str) -> dict[str, str]:
    """Each of ``names`` (space-separated) moved from the folder ``old`` to the folder ``new``."""
    return {f"{old}/{name}": f"{new}/{name}" for name in names.split()}


# Where each release moved the template's files (paths in the project), oldest release first.
MOVES = {
    "v0.5.0": {
        f"{SRC}/utils/runs.py": f"{SRC}/runs/directory.py",
        f"{SRC}/utils/record.py": f"{SRC}/runs/record.py",
        f"{SRC}/utils/summary.py": f"{SRC}/runs/summary.py",
        f"{SRC}/utils/interrupts.py": f"{SRC}/runs/interrupts.py",
        f"{SRC}/utils/checkpointing.py": f"{SRC}/runs/checkpoints.py",
        f"{SRC}/utils/sweep_trial.py": f"{SRC}/sweeps/trial.py",
    },
    # The template's code into src/<package>/framework/, its tests into tests/template/.
    "v0.17.0": {
        **_moved(SRC, FRAMEWORK, "cli.py settings.py errors.py serving.py testing.py"),
        **_moved(
            f"{SRC}/runs",
            f"{FRAMEWORK}/runs",
            "__init__.py checkpoints.py directory.py experiments.py interrupts.py record.py start.py "
            "summary.py torchrun.py trainer.py",
        ),
        **_moved(
            f"{SRC}/sweeps",
            f"{FRAMEWORK}/sweeps",
            "__init__.py command.py folds.py report.py spec.py study.py trial.py worker.py",
        ),
        **_moved(
            f"{SRC}/utils",
            f"{FRAMEWORK}/utils",
            "__init__.py console.py memory.py monitor.py predictions.py progress.py reports.py timing.py "
            "tracking.py wandb_process.py",
        ),
        **_moved(f"{SRC}/models", f"{FRAMEWORK}/models", "base.py classifier.py regressor.py backbone.py"),
        **_moved(
            f"{SRC}/data",
            f"{FRAMEWORK}/data",
            "base.py contract.py file.py images.py preprocessing.py splits.py streaming.py tables.py",
        ),
        **_moved(
            "tests",
            "tests/template",
            "reference.yaml test_backbone.py test_backbone_uses.py test_best_checkpoint.py "
            "test_config.py test_cross_validation.py test_data.py test_ddp.py test_errors.py "
            "test_export.py test_finetuning.py test_guide.py test_images.py test_lint.py "
            "test_loggers.py test_memory.py test_module_checks.py test_multinode.py test_outputs.py "
            "test_outside_data.py test_own_data.py test_own_module.py test_predict_onnx.py "
            "test_refused_inputs.py test_report_script.py test_reports.py test_resume.py "
            "test_scripts.py test_serve.py test_smoke.py test_streaming.py test_sweep.py "
            "test_tooling.py test_training.py test_user_path.py",
        ),
    },
}


def new_home(name: str, release: str) -> tuple[str, list[str]]:
    """Where ``name``, which ``release`` moved, is now, and the releases that moved it: a later
    release may have moved it again (v0.5.0's ``runs/`` went into ``framework/`` in v0.17.0)."""
    moved_in = []
    for version in list(MOVES)[list(MOVES).index(release) :]:
        if name in MOVES[version]:
            name = MOVES[version][name]
            moved_in.append(version)
    return name, moved_in


def main(release: str) -> None:
    stored = stored_answers()
    package = stored["package_name"]
    present = [old for old in MOVES[release] if Path(old.format(package=package)).is_file()]
    if not present:
        return
    with rendered("keep_moved_edits", stored) as old:
        for name in present:
            mine = Path(name.format(package=package))
            written = old / mine
            # A file the old release did not write is the user's own, and the update keeps it.
            if not written.is_file() or mine.read_bytes() == written.read_bytes():
                continue
            new, moved_in = new_home(name, release)
            kept = mine.with_name(mine.name + ".edited")
            mine.rename(kept)
            print(
                f"note: {mine} moved to {new.format(package=package)} in {' and '.join(moved_in)}; "
                f"your edited version is kept as {kept}: "
                "carry your changes over to the new file, then delete it",
                file=sys.stderr,
            )


if __name__ == "__main__":
    main(sys.argv[1])
