"""What a sweep's study holds, printed within 80 columns, and Optuna's plots of it."""

import shutil
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

STATE_WORDS = {
    TrialState.COMPLETE: "finished",
    TrialState.PRUNED: "pruned",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
    TrialState.WAITING: "waiting to be tried again",
}


def shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def report(study: optuna.Study, storage: str, plots_dir: Path, top: int = 10) -> None:
    """Print the trials, finished ones best first and then the pruned, within 80 columns, and
    write Optuna's plots. A pruned trial's value is its best before it stopped."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    settings = study.user_attrs.get("settings", {})
    metric = settings.get("metric", "value")
    trials = study.get_trials(deepcopy=False)
    counts = {word: sum(trial.state == state for trial in trials) for state, word in STATE_WORDS.items()}
    ended = ", ".join(f"{count} {word}" for word, count in counts.items() if count)
    console = Console(width=min(shutil.get_terminal_size().columns, 80), soft_wrap=False)
    console.print(f"Study {study.study_name} ({storage}): {metric}, {study.direction.name.lower()}")
    console.print(f"Trials: {ended or 'none yet'}")
    complete = [trial for trial in trials if trial.state == TrialState.COMPLETE]
    if not complete:
        console.print("No trial has finished yet.")
        return
    best_of = max if study.direction == optuna.study.StudyDirection.MAXIMIZE else min
    best = sorted(complete, key=lambda trial: trial.value, reverse=best_of is max)
    pruned = [trial for trial in trials if trial.state == TrialState.PRUNED and trial.intermediate_values]
    names = list(settings.get("parameters") or best[0].params)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("trial", "run", "status", metric, "epochs", *(name.rsplit(".", 1)[-1] for name in names)):
        table.add_column(column, overflow="fold", justify="left" if column in ("run", "status") else "right")
    for trial in [*best[:top], *pruned[:top]]:
        value = (
            trial.value if trial.state == TrialState.COMPLETE else best_of(trial.intermediate_values.values())
        )
        table.add_row(
            str(trial.number),
            trial.user_attrs.get("run_name", ""),
            STATE_WORDS[trial.state],
            f"{value:.4f}",
            str(max(trial.intermediate_values, default=-1) + 1),
            *(shown(trial.params.get(name, "")) for name in names),
        )
    console.print(table)
    left_out = max(0, len(best) - top) + max(0, len(pruned) - top)
    if left_out:
        console.print(f"{left_out} more trials are in the dashboard (make sweep-dashboard).")
    console.print(f"Best: trial {best[0].number}, run {best[0].user_attrs.get('run_name')}")
    plots_dir.mkdir(parents=True, exist_ok=True)
    console.print(f"Plots in {plots_dir}/:")
    for path in _plots(study, plots_dir, len(complete), metric):
        console.print(f"  {path.name}")


def _plots(study: optuna.Study, plots_dir: Path, complete: int, metric: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    from optuna.visualization import matplotlib as plots

    wanted = {
        "history": plots.plot_optimization_history,
        "parallel_coordinate": plots.plot_parallel_coordinate,
    }
    if complete >= 2:  # importances compare finished trials
        wanted["importances"] = plots.plot_param_importances
    # Optuna's parallel coordinates take plain values only: a parameter of lists (layer sizes) is
    # left out of that plot.
    plain = sorted({name for trial in study.trials for name, value in trial.params.items()})
    plain = [name for name in plain if all(_plain(trial.params.get(name)) for trial in study.trials)]
    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for name, plot in wanted.items():
            if name == "parallel_coordinate" and not plain:
                continue
            only = {"params": plain} if name == "parallel_coordinate" else {}
            axes = plot(study, target_name=metric, **only)
            path = plots_dir / f"{name}.png"
            axes.figure.savefig(path, dpi=100, bbox_inches="tight")
            written.append(path)
    return written


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)
