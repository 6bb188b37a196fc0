"""Writes ``predict`` results to ``predictions.csv`` in the run directory: the predicted class and
the class probabilities, or the predicted value of a regression target."""

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from ..data.contract import SupervisedDataModule


def is_regression(trainer: Trainer, pl_module: LightningModule) -> bool:
    """Whether the run predicts a numeric target rather than classes: the ``task`` of the model or
    of the data."""
    return "regression" in (getattr(pl_module, "task", None), getattr(trainer.datamodule, "task", None))


class PredictionWriter(BasePredictionWriter):
    """One row per sample, in dataset order:

    - classification: ``index, row, label, predicted, prob_<class>`` for every class, by class
      name: ``label`` is the true class, ``predicted`` the most probable one;
    - regression: ``index, row, target, prediction``, both in the target's own units.

    ``index`` is the sample's position in the predicted split; then the columns the data module's
    ``sample_columns`` gives (see ``data/contract.py``): an ``ArrayDataModule``'s ``row``, the
    sample's row in the data it loaded (for a data file, the file's row; for ``predict --inputs``,
    the row in that file), an ``ImageFolderDataModule``'s ``file``, the image file. ``label`` and
    ``target`` are present when the batches carry them (``(inputs, labels)``). Under DDP each
    process writes its own share to ``predictions-rank<N>.csv``. ``written`` holds each file this
    process wrote and its number of rows; the loggers get the total as ``predict/rows``.
    """

    def __init__(self) -> None:
        super().__init__(write_interval="batch_and_epoch")
        self._labels: list[torch.Tensor] = []
        self.written: list[tuple[Path, int]] = []

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._labels = []
        self.written = []

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
        outputs = torch.cat(list(predictions)).float()
        labels = torch.cat(self._labels) if self._labels else None
        indices = [index for batch in batch_indices[0] for index in batch]
        columns: dict[str, list] = {"index": indices}
        if isinstance(trainer.datamodule, SupervisedDataModule):
            columns |= trainer.datamodule.sample_columns(indices)
        if is_regression(trainer, pl_module):
            columns |= regression_columns(outputs, labels)
        else:
            columns |= classification_columns(outputs, labels, pl_module.class_names)
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(columns)
            writer.writerows(zip(*columns.values(), strict=True))
        self.written.append((path, len(indices)))
        rows = trainer.strategy.reduce(torch.tensor(len(indices)), reduce_op="sum")
        for logger in trainer.loggers:
            logger.log_metrics({"predict/rows": int(rows)})


def classification_columns(
    probabilities: torch.Tensor, labels: torch.Tensor | None, class_names: list[str]
) -> dict[str, list]:
    columns = {} if labels is None else {"label": [class_names[c] for c in labels.tolist()]}
    columns["predicted"] = [class_names[c] for c in probabilities.argmax(dim=1).tolist()]
    for name, column in zip(class_names, probabilities.T.tolist(), strict=True):
        columns[f"prob_{name}"] = [f"{p:.6f}" for p in column]
    return columns


def regression_columns(predictions: torch.Tensor, targets: torch.Tensor | None) -> dict[str, list]:
    # Seven significant digits: about what float32 holds, without its noise (0.1, not 0.10000000149).
    columns = {} if targets is None else {"target": [f"{t:.7g}" for t in targets.tolist()]}
    columns["prediction"] = [f"{p:.7g}" for p in predictions.tolist()]
    return columns
