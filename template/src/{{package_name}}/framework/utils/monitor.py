"""Refuses, before training starts, a monitored metric that the model does not log or a mode that
keeps the worst epoch; and tells what a checkpoint's run kept its best epoch by."""

import difflib
import re
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from ..errors import ConfigError
from .best_mode import BEST_MODE, mode_needed


class MonitorCheck(Callback):
    """Checks what the best-checkpoint callback and early stopping monitor, so that a mistake
    stops the run before training rather than at the end of its first epoch, or never:

    - at the start, a mode that would keep the worst epoch (``max`` for a loss, ``min`` for an
      accuracy or F1);
    - once the sanity check has logged the validation metrics, a monitored name that is not
      among them, nor ``epoch`` or ``step``. Names under ``train/`` and ``time/`` are left to
      Lightning, which checks them at the end of the first epoch, when they are first logged;
    - before the first step, a metric of the user's own that the best checkpoint is kept by,
      given without ``checkpoint.mode``: which way it is best is asked, not guessed.
    """

    def __init__(self, mode_unknown: bool = False) -> None:
        self.mode_unknown = mode_unknown  # checkpoint.monitor is the user's metric, without its mode

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for key, callback in _monitoring(trainer):
            best, mode = BEST_MODE.get(callback.monitor.rsplit("/", 1)[-1]), getattr(callback, "mode", None)
            if best and mode and mode != best:
                raise ConfigError(
                    f"{key}.monitor={callback.monitor} with {key}.mode={mode} would keep the worst "
                    f"epoch; set {key}.mode={best}"
                )

    def on_sanity_check_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        logged = sorted(trainer.callback_metrics)
        for key, callback in _monitoring(trainer):
            monitor = callback.monitor
            if monitor in (*logged, "epoch", "step") or monitor.startswith(("train/", "time/")):
                continue
            close = difflib.get_close_matches(monitor, logged, n=1)
            raise ConfigError(
                f"{key}.monitor={monitor} is not a metric the model logs; validation logs "
                f"{', '.join(logged)}" + (f" (did you mean {close[0]}?)" if close else "")
            )

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.mode_unknown and trainer.checkpoint_callback is not None:
            raise ConfigError(mode_needed(trainer.checkpoint_callback.monitor))


def _monitoring(trainer: Trainer) -> list[tuple[str, Callback]]:
    """The callbacks that monitor a metric, each with the config key it is set under."""
    return [
        ("checkpoint" if isinstance(callback, ModelCheckpoint) else type(callback).__name__, callback)
        for callback in trainer.callbacks
        if isinstance(getattr(callback, "monitor", None), str)
    ]


def kept_by(checkpoint: dict[str, Any]) -> tuple[str, str | None] | None:
    """The metric, and mode, by which the run that saved ``checkpoint`` kept its best checkpoint;
    None when it kept none by a metric."""
    for key, state in checkpoint.get("callbacks", {}).items():
        # Lightning names a ModelCheckpoint's state by its settings: "ModelCheckpoint{'monitor': ...}".
        if key.startswith("ModelCheckpoint") and isinstance(state, dict) and state.get("monitor"):
            mode = re.search(r"'mode': '(\w+)'", key)
            return state["monitor"], mode[1] if mode else None
    return None


def best_of(checkpoint: dict[str, Any]) -> str | None:
    """The path of the best checkpoint that the run which saved ``checkpoint`` had kept so far;
    None when it kept none."""
    for key, state in checkpoint.get("callbacks", {}).items():
        if key.startswith("ModelCheckpoint") and isinstance(state, dict) and state.get("best_model_path"):
            return state["best_model_path"]
    return None
