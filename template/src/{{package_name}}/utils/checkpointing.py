"""``last.ckpt``: the state at the end of the latest training epoch, for resuming."""

from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer


class LastCheckpoint(Callback):
    """Saves ``<dirpath>/last.ckpt`` at the end of every training epoch, after validation.

    ``ModelCheckpoint(save_last=True)`` in Lightning 2.6 rewrites ``last.ckpt`` only when it also
    saves a best checkpoint, so after the best epoch its "last" would stop moving.
    """

    def __init__(self, dirpath: str | Path) -> None:
        self.path = Path(dirpath) / "last.ckpt"

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)
