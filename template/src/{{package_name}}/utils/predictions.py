"""Writes ``predict`` results to ``predictions.csv`` in the run directory: class and probabilities."""

import csv
from collections.abc import Sequence
from pathlib import Path

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter


class PredictionWriter(BasePredictionWriter):
    """One row per sample, in dataset order: ``index, predicted, prob_0 .. prob_{C-1}``.

    Under DDP each process writes its own share to ``predictions-rank<N>.csv``.
    """

    def __init__(self) -> None:
        super().__init__(write_interval="epoch")

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
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["index", "predicted", *(f"prob_{c}" for c in range(probabilities.shape[1]))])
            predicted = probabilities.argmax(dim=1).tolist()
            for index, label, row in zip(indices, predicted, probabilities.tolist(), strict=True):
                writer.writerow([index, label, *(f"{p:.6f}" for p in row)])
