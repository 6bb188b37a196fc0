"""The progress bar: Lightning's tqdm one, redrawn a few times a second however short the batches."""

import contextlib
import time

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar


class ProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` that redraws at most ``per_second`` times a second, and after the last
    batch of each stage.

    Lightning's bars redraw after every batch, which slows down a run of short batches.
    """

    def __init__(self, per_second: float = 4) -> None:
        super().__init__()
        self.interval = 1 / per_second
        self._next_draw = 0.0

    def _should_update(self, current: int, total: int | float | None) -> bool:
        # The total is unknown (None) in an epoch resumed part-way through.
        now = time.monotonic()
        last = total is not None and current >= total
        if not self.is_enabled or (not last and now < self._next_draw):
            return False
        self._next_draw = now + self.interval
        return True

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        # Lightning shows the logger's version as v_num: for wandb, the end of a random run id.
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Reading the metrics at an epoch's end computes the values logged with sync_dist, a
        # collective operation every DDP process must join. Only rank 0 draws the bar, so every
        # process reads them here, in the same order, and rank 0 alone shows them.
        metrics = self.get_metrics(trainer, pl_module)
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(metrics)
        if self._leave:
            self.train_progress_bar.close()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # A bar is drawn without a line break; the error line the command ends with starts on a
        # line of its own. The validation bar, drawn below the training bar, is cleared first.
        for stage in ("val", "test", "predict", "train"):
            with contextlib.suppress(TypeError):  # a bar not made in this run
                bar = getattr(self, f"{stage}_progress_bar")
                if not bar.disable:
                    bar.close()
