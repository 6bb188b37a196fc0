"""What ``scripts/sweep.py`` does: run a sweep (one worker, or several on this machine) and report
its study, or report a study or serve its dashboard."""

import os
import shutil
import sys
from pathlib import Path

import optuna

from .report import report
from .spec import check_parameters, read_sweep
from .study import SWEEPS_DIR, existing_storage, open_storage, open_study, printable, storage_of, study_name
from .warm import warm_up
from .worker import Worker, fit_settings, quiet_optuna, run_here_or_launch, runs_dir_of


def show(name_or_file: str, storage: str | None, dashboard: bool, port: int) -> None:
    """Report a study, or serve optuna-dashboard on it, on localhost only."""
    name = study_name(name_or_file)
    storage = existing_storage(name, storage)
    opened = open_storage(storage)
    if dashboard:
        found = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent))
        command = found or "optuna-dashboard"
        os.execv(command, [command, storage, "--host", "127.0.0.1", "--port", str(port)])
    report(optuna.load_study(study_name=name, storage=opened), printable(storage), SWEEPS_DIR / name)


def sweep(
    path: Path, trials: int | None, storage: str | None, workers: int, words: list[str], script: str
) -> int:
    """Run the sweep of ``path`` to its budget and report it; the status to exit with. ``words``:
    the script's arguments, which ``--workers`` passes on to each worker; after ``--``, every fit's."""
    settings = read_sweep(path)
    if settings["start"] == "warm":
        warm_up()  # its import goes on while the storage is opened
    if trials is not None:
        settings["trials"] = trials
    fit_args = words[words.index("--") + 1 :] if "--" in words else []
    storage = storage_of(settings["name"], storage)
    quiet_optuna()
    if "SWEEP_WORKER" not in os.environ:  # else the command that started the workers checked
        open_storage(storage, settings)  # first: a storage that cannot be opened costs no fit's start
        check_parameters(path, settings, fit_settings(fit_args, warm=settings["start"] == "warm"))
    study = open_study(settings, storage, fit_args, runs_dir_of(fit_args))
    status = run_here_or_launch(Worker(settings, study, storage, fit_args), script, words, workers)
    if status is not None:
        return status
    report(study, printable(storage), SWEEPS_DIR / settings["name"])
    return 0
