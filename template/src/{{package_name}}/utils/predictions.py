"""Writes ``predict`` results to ``predictions.csv`` in the run directory: class and probabilities."""

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from ..data.base import ArrayDataModule


class PredictionWriter(BasePredictionWriter):
    """One row per sample, in dataset order: ``index, row, label, predicted, prob_0 .. prob_{C-1}``.

    ``index`` is the sample's position in the predicted split; ``row`` its row in the data the data
    module loaded (for a data file, the file's row; for ``predict --inputs``, the row in that
    file), when the data module is an ``ArrayDataModule``.

    ``label`` is the true class, present when the batches carry labels (``(inputs, labels)``);
    ``predicted`` is the most probable class. Under DDP each process writes its own share to
    ``predictions-rank<N>.csv``.
    """

    def __init__(self) -> None:
        super().__init__(write_interval="batch_and_epoch")
        self._labels: list[torch.Tensor] = []

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._labels = []

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        if isinstance(batch, list | tuple) and len(batch) == 2:
            self._labels.append(batch[1].cpu())

    def write_on_epoch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        predictions: Sequence[torch.Tensor],
        batch_indices: Sequence,
    ) -> None:
        suffix = "" if trainer.world_size == 1 else f"-rank{trainer.global_rank}"
        path = Path(trainer.default_root_dir) / f"predictions{suffix}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        probabilities = torch.cat(list(predictions)).float()
        indices = [index for batch in batch_indices[0] for index in batch]
        columns: dict[str, list] = {"index": indices}
        datamodule = trainer.datamodule
        if isinstance(datamodule, ArrayDataModule):
            columns["row"] = datamodule.rows[datamodule.predict_split][indices].tolist()
        if self._labels:
            columns["label"] = torch.cat(self._labels).tolist()
        columns["predicted"] = probabilities.argmax(dim=1).tolist()
        for c, column in enumerate(probabilities.T.tolist()):
            columns[f"prob_{c}"] = [f"{p:.6f}" for p in column]
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(columns)
            writer.writerows(zip(*columns.values(), strict=True))
