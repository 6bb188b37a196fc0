"""A fit as a trial of an Optuna study: ``scripts/sweep.py`` adds this callback to each trial's fit.

The fit reports the monitored metric to its trial after every validation, and asks the study's
pruner whether to go on. A pruned trial stops at the end of that epoch like any other fit that
stops early: its checkpoints are saved, and its line in experiments.jsonl says ``pruned``.
(optuna-integration's Lightning callback raises inside ``fit`` instead, which would end the run as
failed, without the checkpoint of its last epoch.) Needs the ``sweep`` extra (optuna).
"""

import os
import signal
import sys
from typing import Any, Literal

import optuna
from lightning.pytorch import Callback, LightningModule, Trainer

from ..errors import ConfigError
from ..runs.interrupts import end_with_parent
from .study import LOST, STORAGE_VARIABLE, reason_of


def open_storage(storage: str) -> Any:
    """An Optuna storage: a database URL (sqlite:///..., postgresql://...), or a file ending in
    ``.journal``, a journal file for a shared filesystem, where SQLite's locking is unsafe."""
    if storage.endswith(".journal"):
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(storage))
    return storage


class SweepTrial(Callback):
    """Reports ``monitor`` to the trial ``trial_id`` of ``study`` after each epoch's validation,
    and stops the fit when the pruner says so. ``median`` prunes a trial whose value at an epoch
    is worse than the median of the earlier trials' at that epoch, once ``startup_trials`` have
    finished and from epoch ``warmup_epochs`` on; ``none`` never prunes.

    The study is in ``storage``, by default the environment's ``SWEEP_STORAGE``: the worker sets
    that, so that a database's password is not written into the run's config.yaml."""

    def __init__(
        self,
        study: str,
        trial_id: int,
        monitor: str,
        storage: str | None = None,
        pruner: Literal["median", "none"] = "median",
        startup_trials: int = 4,
        warmup_epochs: int = 3,
    ) -> None:
        self.monitor = monitor
        self.pruned = False  # the experiment record reads it
        self._where = {"study_name": study, "storage": storage or os.environ.get(STORAGE_VARIABLE)}
        self._pruner = (
            optuna.pruners.MedianPruner(startup_trials, n_warmup_steps=warmup_epochs)
            if pruner == "median"
            else optuna.pruners.NopPruner()
        )
        self._trial_id = trial_id
        self._trial: optuna.Trial | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        end_with_parent()  # the sweep's worker: if it is killed, the fit saves last.ckpt and exits
        if trainer.is_global_zero:
            if not self._where["storage"]:
                raise ConfigError(f"SweepTrial has no storage: give its storage, or set {STORAGE_VARIABLE}")
            try:
                storage = open_storage(self._where["storage"])
                study = optuna.load_study(
                    study_name=self._where["study_name"], storage=storage, pruner=self._pruner
                )
            except LOST as error:
                reason = reason_of(error, self._where["storage"])
                raise ConfigError(f"the sweep's storage does not answer: {reason}") from None
            self._trial = optuna.Trial(study, self._trial_id)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        prune = False
        if self._trial is not None:
            try:
                self._trial.report(float(trainer.callback_metrics[self.monitor]), step=trainer.current_epoch)
                prune = self._trial.should_prune()
            except LOST as error:
                # Stop as SIGTERM stops a fit, saving last.ckpt: the worker tries the trial again,
                # or, having lost the storage too, ends, and the sweep run again resumes it.
                reason = reason_of(error, self._where["storage"])
                print(f"\nerror: the sweep's storage stopped answering: {reason}", file=sys.stderr)
                self._trial = None
                os.kill(os.getpid(), signal.SIGTERM)
            # A trial at its last epoch has finished: pruning it would only lose its value.
            last = trainer.max_epochs not in (None, -1) and trainer.current_epoch + 1 >= trainer.max_epochs
            prune = prune and not last
        if trainer.strategy.broadcast(prune):
            self.pruned = trainer.should_stop = True
