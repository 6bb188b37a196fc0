"""Refuses a monitored validation metric that the model does not log, right after the sanity check."""

import difflib

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from ..errors import ConfigError


class MonitorCheck(Callback):
    """Checks the names that the best-checkpoint callback and early stopping monitor as soon as
    the sanity check has logged the validation metrics. Lightning finds a wrong name only at the
    end of the first epoch.

    Only validation metrics (``val/...``) are checked here: training metrics of an epoch exist only
    at its end, where Lightning checks them.
    """

    def on_sanity_check_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        logged = sorted(name for name in trainer.callback_metrics if name.startswith("val/"))
        for callback in trainer.callbacks:
            monitor = getattr(callback, "monitor", None)
            if not isinstance(monitor, str) or not monitor.startswith("val/") or monitor in logged:
                continue
            key = "checkpoint" if isinstance(callback, ModelCheckpoint) else type(callback).__name__
            close = difflib.get_close_matches(monitor, logged, n=1)
            raise ConfigError(
                f"{key}.monitor={monitor} is not a metric the model logs; it logs {', '.join(logged)}"
                + (f" (did you mean {close[0]}?)" if close else "")
            )
