"""Wall time per training, validation and test epoch, logged as ``time/<stage>_epoch_s``."""

import time

from lightning.pytorch import Callback, LightningModule, Trainer


class StageTimer(Callback):
    """Logs how long each epoch of each stage took; the sanity check is not timed."""

    def __init__(self) -> None:
        self._started: dict[str, float] = {}

    def _start(self, stage: str) -> None:
        self._started[stage] = time.perf_counter()

    def _stop(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage in self._started and not trainer.sanity_checking:
            elapsed = time.perf_counter() - self._started.pop(stage)
            pl_module.log(f"time/{stage}_epoch_s", elapsed, sync_dist=True)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start("train")

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop(trainer, pl_module, "train")

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start("val")

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop(trainer, pl_module, "val")

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start("test")

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop(trainer, pl_module, "test")
