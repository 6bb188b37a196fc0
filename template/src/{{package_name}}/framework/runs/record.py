"""The experiment record's callback: one JSON line per fit and test appended to ``experiments.jsonl``
(``framework/runs/experiments.py`` writes and reads the file)."""

import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from .checkpoints import LastCheckpoint
from .experiments import append_line, read_lines


def git_state() -> tuple[str | None, bool | None]:
    """The checked-out commit, and whether the tree differs from it: changed tracked files or
    untracked files that git does not ignore (a model in a file never committed, say). None and
    None outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        # The record itself changes with every run, so it does not make the tree dirty.
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=normal", "--", ".", ":!experiments.jsonl"],
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return commit.stdout.strip(), bool(status.stdout.strip())


def _saved_epoch(checkpoint: str) -> int:
    """The epoch a checkpoint was saved in; memory-mapped, so its tensors are not read."""
    return torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)["epoch"]


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def _number(value: Any) -> float | None:
    return None if value is None else round(float(value), 6)


def pruned(trainer: Trainer) -> bool:
    """Whether a sweep's pruner stopped the fit early (``framework/sweeps/trial.py``)."""
    return any(getattr(callback, "pruned", False) for callback in trainer.callbacks)


class ExperimentRecord(Callback):
    """Appends one line after each fit and each test, written by the global rank 0 process only.

    A fit line holds the monitored metric's best value and epoch, the best and last checkpoints, and
    what became of missing values (the data module's ``missing_values``: the rule, the table's rows,
    those dropped and the values imputed); a test line holds the test metrics and the checkpoint
    they came from. A classifier's lines also hold its ``classes``, the class names by class index
    (the model's ``class_names``). ``summary`` carries what the CLI knows of the run: name, model,
    dataset, seed and key hyper-parameters. A fit stopped by SIGTERM or Ctrl-C writes its line too,
    with ``status`` ``interrupted`` instead of ``finished``; a sweep's trial stopped by its pruner
    has ``pruned``. A run resumed after an interruption is trained in parts, one a process: each
    checkpoint carries the parts so far, and a fit's line lists them (``parts``: when each started
    and its time) with ``wall_time_s`` their total. ``last_line`` gives the line of a stage, for the
    summary the command ends with.
    """

    def __init__(self, path: str | Path, summary: dict[str, Any]) -> None:
        self.path = Path(path)
        self.summary = summary
        self.lines: dict[str, dict[str, Any]] = {}
        self._started = time.perf_counter()
        self._started_at = _now()
        self._earlier_parts: list[dict[str, Any]] = []  # a resumed fit's parts before this process

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._started = time.perf_counter()
        self._started_at = _now()

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._started = time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        part = {"started": self._started_at, "wall_time_s": round(time.perf_counter() - self._started, 2)}
        parts = [*self._earlier_parts, part]
        return {"wall_time_s": round(sum(part["wall_time_s"] for part in parts), 2), "parts": parts}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # A checkpoint written before parts were kept holds the total time only.
        earlier = [{"started": None, "wall_time_s": state_dict["wall_time_s"]}]
        self._earlier_parts = state_dict.get("parts", earlier)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write_fit(trainer, pl_module, "pruned" if pruned(trainer) else "finished")

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException) and trainer.state.fn == "fit":
            self._write_fit(trainer, pl_module, "interrupted")

    def _write_fit(self, trainer: Trainer, pl_module: LightningModule, status: str) -> None:
        checkpoint = trainer.checkpoint_callback
        best = checkpoint.best_model_path or None
        last = next((c.path for c in trainer.callbacks if isinstance(c, LastCheckpoint)), None)
        self._write(
            trainer,
            pl_module,
            stage="fit",
            status=status,
            epochs=trainer.current_epoch,
            steps=trainer.global_step,
            effective_batch_size=getattr(pl_module, "effective_batch_size", None),
            monitor=checkpoint.monitor,
            best_value=_number(checkpoint.best_model_score),
            best_epoch=_saved_epoch(best) if best else None,
            best_checkpoint=best,
            last_checkpoint=str(last.resolve()) if last and last.is_file() else None,
            missing_values=getattr(trainer.datamodule, "missing_values", None),
            test=None,
            **self.state_dict(),
        )

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        metrics = {name: _number(value) for name, value in trainer.callback_metrics.items()}
        self._write(
            trainer,
            pl_module,
            stage="test",
            checkpoint=str(Path(trainer.ckpt_path).resolve()) if trainer.ckpt_path else None,
            test={name: value for name, value in metrics.items() if name.startswith("test/")},
        )

    def _write(self, trainer: Trainer, pl_module: LightningModule, **fields: Any) -> None:
        if not trainer.is_global_zero:
            return
        classes = getattr(pl_module, "class_names", None)  # a classifier's
        line = {
            "time": _now(),
            **self.summary,
            **({"classes": classes} if classes is not None else {}),
            "wall_time_s": round(time.perf_counter() - self._started, 2),
            **fields,
        }
        commit, dirty = git_state()
        line |= {"git_commit": commit and commit + ("+dirty" if dirty else ""), "git_dirty": dirty}
        append_line(self.path, line)
        self.lines[fields["stage"]] = line

    def last_line(self, stage: str) -> dict[str, Any]:
        """The line this process wrote last for ``stage``, or, where another process wrote it
        (ddp_spawn's rank 0), the record's last line of that stage for this run."""
        if stage not in self.lines:
            run = (stage, self.summary["run_name"])
            lines = [
                line for line in read_lines(self.path) if (line.get("stage"), line.get("run_name")) == run
            ]
            self.lines[stage] = lines[-1]
        return self.lines[stage]
