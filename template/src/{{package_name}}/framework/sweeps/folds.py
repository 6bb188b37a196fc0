"""Cross-validation, as ``scripts/cross_validate.py`` runs it: one fit per fold of the data, each
then testing its best checkpoint, as the trials of an Optuna study (a grid over
``data.init_args.fold``, with ``data.init_args.folds`` among every fit's arguments). It runs on the
sweep's workers: a fold killed with its worker resumes from its last checkpoint when the same
command runs again, a finished fold is not run again, and ``--workers`` shares the folds. The
table of each fold's best validation value and test metrics, with their mean and standard
deviation, is printed and written to ``cross_validation/<name>.csv``.
"""

import csv
import importlib
import os
import statistics
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from ..errors import ConfigError
from ..runs.experiments import RECORD_FILE, read_lines
from ..utils.best_mode import best_mode, mode_needed
from .spec import KEYS, SweepError, check_name
from .study import open_storage, open_study, printable, retry
from .warm import warm_up
from .worker import (
    Worker,
    fit_settings,
    quiet_optuna,
    run_here_or_launch,
    runs_dir_of,
)

CV_DIR = Path("cross_validation")
FOLD = "data.init_args.fold"


class FoldWorker(Worker):
    """A sweep's worker whose trials are folds: run ``<name>-fold<k>``, tested after its fit in
    the same process (``--test_after_fit``)."""

    def run_name_of(self, trial: optuna.Trial, values: dict[str, Any]) -> str:
        return f"{self.sweep['name']}-fold{values[FOLD]}"


def check_data(settings: dict[str, Any], folds: int) -> None:
    """Refuse, before any fit, a data module that takes no folds, and data that cannot be cut into
    ``folds`` folds: its first fold is made here, as each fit would make it."""
    data = settings["data"]
    module, _, name = data["class_path"].rpartition(".")
    arguments = data.get("init_args") or {}
    if "folds" not in arguments:
        raise SweepError(
            f"{name} takes no data.init_args.folds: cross-validation needs a data module that splits "
            "a table or arrays (an ArrayDataModule)"
        )
    try:
        getattr(importlib.import_module(module), name)(**{**arguments, "folds": folds, "fold": 0}).prepare()
    except (ConfigError, ValueError, ImportError) as error:
        raise SweepError(str(error)) from None


def cross_validate(name: str, folds: int, workers: int, words: list[str], script: str) -> int:
    """Run the folds not yet finished, then print and write the table; the status to exit with.
    ``words``: the script's arguments, passed on to each worker; after ``--``, every fit's."""
    check_name(name, "--name")
    fit_args = words[words.index("--") + 1 :] if "--" in words else []
    warm_up()  # its import goes on while the storage is opened
    CV_DIR.mkdir(exist_ok=True)
    storage = f"sqlite:///{CV_DIR / name}.db"
    quiet_optuna()
    settings = fit_settings(fit_args)
    checkpoint = settings["checkpoint"]
    mode = best_mode(checkpoint["monitor"], checkpoint["mode"])
    if mode is None:
        raise SweepError(mode_needed(checkpoint["monitor"]))
    sweep = {
        **KEYS,
        "name": name,
        "metric": checkpoint["monitor"],
        "direction": "maximize" if mode == "max" else "minimize",
        "parameters": {FOLD: {"choices": list(range(folds))}},
        "trials": folds,
        "sampler": "grid",
        "pruner": "none",
    }
    fit_args = [*fit_args, f"--data.init_args.folds={folds}"]
    if "SWEEP_WORKER" not in os.environ:  # else the command that started the workers checked
        open_storage(storage, sweep)
        check_data(settings, folds)
    study = open_study(sweep, storage, fit_args, runs_dir_of(fit_args))
    if "SWEEP_WORKER" not in os.environ:
        retry_failed(study)
    fold_worker = FoldWorker(sweep, study, storage, [*fit_args, "--test_after_fit=true"])
    status = run_here_or_launch(fold_worker, script, words, workers)
    if status is not None:
        return status
    rows = table(study, sweep["metric"])
    write(rows, CV_DIR / f"{name}.csv")
    print(f"Cross-validation {name} ({printable(storage)}): {len(rows) - 2} of {folds} folds finished")
    print(shown(rows))
    print(f"Written to {CV_DIR / name}.csv")
    return 0


def retry_failed(study: optuna.Study) -> None:
    """Queue again each fold whose last trial failed and that none finished, runs or waits for, to
    resume from its last checkpoint: Optuna's grid takes a failed point for a visited one."""
    settled = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)
    trials = study.get_trials(deepcopy=False)
    done = {trial.user_attrs.get("run_name") for trial in trials if trial.state in settled}
    failed = {trial.user_attrs.get("run_name"): trial for trial in trials if trial.state == TrialState.FAIL}
    for run_name, trial in failed.items():  # the last failure of each run, by the trials' order
        if run_name not in done and trial.params:
            retry(study, trial.number, trial.params, run_name)


def table(study: optuna.Study, metric: str) -> list[dict[str, Any]]:
    """A row per finished fold (its best ``metric`` and its test metrics, from experiments.jsonl),
    then the mean and the standard deviation of each column."""
    tests = {
        line["run_name"]: line.get("test") or {}
        for line in (read_lines(RECORD_FILE) if RECORD_FILE.is_file() else [])
        if line.get("stage") == "test"
    }  # the last test line of each run
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    last = {trial.params[FOLD]: trial for trial in sorted(finished, key=lambda trial: trial.number)}
    trials = [last[fold] for fold in sorted(last)]  # a fold run twice counts once, by its last run
    rows = [
        {"fold": trial.params[FOLD], metric: trial.value, **tests.get(trial.user_attrs["run_name"], {})}
        for trial in trials
    ]
    columns = [column for row in rows for column in row if column != "fold"]
    columns = list(dict.fromkeys(columns))
    summary = []
    for label, of in (("mean", statistics.fmean), ("std", statistics.stdev)):
        values = {column: [row[column] for row in rows if row.get(column) is not None] for column in columns}
        enough = 1 if of is statistics.fmean else 2
        summary.append({"fold": label, **{c: of(v) if len(v) >= enough else None for c, v in values.items()}})
    return [*rows, *summary]


def shown(rows: list[dict[str, Any]]) -> str:
    """The table as aligned text, numbers to 4 decimals."""
    columns = list(dict.fromkeys(column for row in rows for column in row))
    cells = [columns] + [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(line[index]) for line in cells) for index in range(len(columns))]
    lines = ("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)) for line in cells)
    return "\n".join(lines)


def write(rows: list[dict[str, Any]], path: Path) -> None:
    columns = list(dict.fromkeys(column for row in rows for column in row))
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, columns)
        writer.writeheader()
        writer.writerows(rows)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4f}" if isinstance(value, float) else str(value)
