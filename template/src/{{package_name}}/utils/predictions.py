"""Writes ``predict`` results to ``predictions.csv`` in the run directory, batch by batch: the
predicted class, its probability and the ``top_k`` most probable classes, or the predicted value
of a regression target."""

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from ..data.contract import PredictBatch, SupervisedDataModule


def is_regression(trainer: Trainer, pl_module: LightningModule) -> bool:
    """Whether the run predicts a numeric target rather than classes: the ``task`` of the model or
    of the data."""
    return "regression" in (getattr(pl_module, "task", None), getattr(trainer.datamodule, "task", None))


class PredictionWriter(BasePredictionWriter):
    """One row per sample, in dataset order, written as each batch is predicted:

    - classification: ``index, <where>, label, predicted, probability``, then ``top<n>`` and
      ``top<n>_probability`` for the ``top_k`` most probable classes (at most every class), by
      class name: ``label`` is the true class, ``predicted`` the most probable one;
    - regression: ``index, <where>, target, prediction``, both in the target's own units.

    ``index`` is the sample's position in the predicted samples; ``<where>`` the columns the data
    module's ``sample_columns`` gives (see ``data/contract.py``): an ``ArrayDataModule``'s ``row``,
    the sample's row in the data it loaded (for a data file, the file's row; for ``predict
    --inputs``, the row in that file), an ``ImageFolderDataModule``'s ``file``, the image file.
    ``label`` and ``target`` are present when the batches carry them (``(inputs, labels)``). A
    ``PredictBatch`` may leave samples out (unreadable images, skipped): ``skipped`` counts them.
    Under DDP each process writes its own share to ``predictions-rank<N>.csv``. ``written`` holds
    each file this process wrote and its number of rows; the loggers get the total as
    ``predict/rows``.
    """

    def __init__(self, top_k: int = 3) -> None:
        super().__init__(write_interval="batch")
        self.top_k = top_k
        self.written: list[tuple[Path, int]] = []
        self.skipped = 0
        self._file: IO[str] | None = None
        self._rows = 0

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        suffix = "" if trainer.world_size == 1 else f"-rank{trainer.global_rank}"
        self.path = Path(trainer.default_root_dir) / f"predictions{suffix}.csv"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", newline="")
        self._rows, self.skipped, self.written = 0, 0, []

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
        labels = None
        if isinstance(batch, PredictBatch):
            indices = batch.indices.tolist()
            self.skipped += len(batch_indices or ()) - len(indices)
        else:
            indices = list(batch_indices or ())
            if isinstance(batch, list | tuple) and len(batch) == 2:
                labels = batch[1].cpu()
        columns: dict[str, list] = {"index": indices}
        if isinstance(trainer.datamodule, SupervisedDataModule):
            columns |= trainer.datamodule.sample_columns(indices)
        outputs = prediction.float().cpu()
        if is_regression(trainer, pl_module):
            columns |= regression_columns(outputs, labels)
        else:
            columns |= classification_columns(outputs, labels, pl_module.class_names, self.top_k)
        writer = csv.writer(self._file)
        if self._file.tell() == 0:
            writer.writerow(columns)
        writer.writerows(zip(*columns.values(), strict=True))
        self._file.flush()
        self._rows += len(indices)

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close()
        self.written.append((self.path, self._rows))
        rows = trainer.strategy.reduce(torch.tensor(self._rows), reduce_op="sum")
        for logger in trainer.loggers:
            logger.log_metrics({"predict/rows": int(rows)})

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def top_classes(probabilities: torch.Tensor, class_names: list[str], k: int) -> list[list[tuple[str, float]]]:
    """Each sample's ``k`` most probable classes (at most every class), most probable first, as
    ``(class name, probability)``."""
    top = probabilities.topk(min(k, probabilities.shape[1]), dim=1)
    return [
        [(class_names[c], p) for c, p in zip(classes, values, strict=True)]
        for classes, values in zip(top.indices.tolist(), top.values.tolist(), strict=True)
    ]


def classification_columns(
    probabilities: torch.Tensor, labels: torch.Tensor | None, class_names: list[str], top_k: int
) -> dict[str, list]:
    columns = {} if labels is None else {"label": [class_names[c] for c in labels.tolist()]}
    ranked = top_classes(probabilities, class_names, top_k)
    k = min(top_k, probabilities.shape[1])
    columns["predicted"] = [classes[0][0] for classes in ranked]
    columns["probability"] = [f"{classes[0][1]:.6f}" for classes in ranked]
    for n in range(k):
        columns[f"top{n + 1}"] = [classes[n][0] for classes in ranked]
        columns[f"top{n + 1}_probability"] = [f"{classes[n][1]:.6f}" for classes in ranked]
    return columns


def regression_columns(predictions: torch.Tensor, targets: torch.Tensor | None) -> dict[str, list]:
    # Seven significant digits: about what float32 holds, without its noise (0.1, not 0.10000000149).
    columns = {} if targets is None else {"target": [f"{t:.7g}" for t in targets.tolist()]}
    columns["prediction"] = [f"{p:.7g}" for p in predictions.tolist()]
    return columns
