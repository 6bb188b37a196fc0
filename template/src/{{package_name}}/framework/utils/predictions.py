"""Writes ``predict`` results to ``predictions.csv`` in the run directory, batch by batch: the
predicted class, its probability and the ``top_k`` most probable classes, the predicted value of
a regression target, or the outputs of a module of your own (beside it in ``.npy`` files when
they are larger than a few numbers per sample)."""

import csv
import io
import math
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from ..data.contract import PredictBatch, SupervisedDataModule
from ..errors import ConfigError

# A module's output of at most this many numbers per sample becomes columns of predictions.csv;
# a larger one, or one of more dimensions (an image), goes to a .npy file.
MAX_OUTPUT_COLUMNS = 32
# The names a dict returned by predict_step may use: they become column and file names.
OUTPUT_NAME = re.compile(r"[A-Za-z0-9_-]+")


class PredictionWriter(BasePredictionWriter):
    """One row per sample, in dataset order, written as each batch is predicted:

    - classification: ``index, <where>, label, predicted, probability``, then ``top<n>`` and
      ``top<n>_probability`` for the ``top_k`` most probable classes (at most every class), by
      class name: ``label`` is the true class, ``predicted`` the most probable one;
    - regression: ``index, <where>, target, prediction``, both in the target's own units;
    - a module of your own, neither a classifier (one that gives ``class_names``) nor one of
      ``task`` regression: ``index, <where>``, ``label`` or ``target``, then its outputs (see
      ``output_columns``).

    ``index`` is the sample's position in the predicted samples; ``<where>`` the columns the data
    module's ``sample_columns`` gives (see ``framework/data/contract.py``): an ``ArrayDataModule``'s ``row``,
    the sample's row in the data it loaded (for a data file, the file's row; for ``predict
    --inputs``, the row in that file), an ``ImageFolderDataModule``'s ``file``, the image file.
    ``label`` and ``target`` are present when the batches carry them (``(inputs, labels)``). A
    ``PredictBatch`` may leave samples out (unreadable images, skipped): ``skipped`` counts them.
    Under DDP each process writes its own share to ``predictions-rank<N>.csv`` (and
    ``predictions[-<name>]-rank<N>.npy``). ``written`` holds each file this process wrote and its
    number of rows; the loggers get the total as ``predict/rows``.
    """

    def __init__(self, top_k: int = 3) -> None:
        super().__init__(write_interval="batch")
        self.top_k = top_k
        self.written: list[tuple[Path, int]] = []
        self.skipped = 0
        self._file: IO[str] | None = None
        self._rows = 0
        self._arrays: dict[str, ArrayFile] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._suffix = "" if trainer.world_size == 1 else f"-rank{trainer.global_rank}"
        self.path = Path(trainer.default_root_dir) / f"predictions{self._suffix}.csv"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", newline="")
        self._rows, self.skipped, self.written = 0, 0, []
        self._arrays, self._shapes = {}, {}

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
        class_names = getattr(pl_module, "class_names", None)
        if class_names is not None:
            columns |= classification_columns(prediction.float().cpu(), labels, class_names, self.top_k)
        elif getattr(pl_module, "task", None) == "regression":
            columns |= regression_columns(prediction.float().cpu(), labels)
        else:
            columns |= label_columns(trainer.datamodule, labels)
            outputs = self.output_columns(pl_module, prediction, len(indices))
            if clash := sorted(columns.keys() & outputs.keys()):
                refuse(pl_module, len(indices), f"outputs named as other columns of predictions.csv: {clash}")
            columns |= outputs
        writer = csv.writer(self._file)
        if self._file.tell() == 0:
            writer.writerow(columns)
        writer.writerows(zip(*columns.values(), strict=True))
        self._file.flush()
        self._rows += len(indices)

    def output_columns(self, pl_module: LightningModule, prediction: Any, rows: int) -> dict[str, list]:
        """The columns of the outputs of a module of your own, each named ``<name>``: ``output``
        for a tensor, or a key of the dict ``predict_step`` returned. One number per sample is the
        column ``<name>``; a vector of at most ``MAX_OUTPUT_COLUMNS`` numbers the columns
        ``<name>0``, ``<name>1``, ...; anything larger (an image, a long embedding) goes to
        ``predictions.npy`` (``predictions-<name>.npy`` for a key), an array of shape ``(rows,
        *output shape)`` written batch by batch, and the column ``<name>_row`` is each sample's
        row in it. Numbers are written as the shortest text that reads back as the same number."""
        columns = {}
        for name, values in named_outputs(pl_module, prediction, rows).items():
            key = f"{name!r}: " if isinstance(prediction, dict) else ""
            shape = self._shapes.setdefault(name, values.shape[1:])
            if values.shape[1:] != shape:
                refuse(pl_module, rows, f"{key}outputs of shape {values.shape[1:]} per sample after {shape}")
            if len(shape) <= 1 and math.prod(shape) <= MAX_OUTPUT_COLUMNS:
                columns |= value_columns(name, values)
                continue
            if name not in self._arrays:
                stem = f"predictions-{name}" if key else "predictions"
                path = self.path.with_name(f"{stem}{self._suffix}.npy")
                self._arrays[name] = ArrayFile(path, shape, values.dtype)
            first = self._arrays[name].rows
            self._arrays[name].append(values)
            columns[f"{name}_row"] = list(range(first, self._arrays[name].rows))
        return columns

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close()
        self.written.append((self.path, self._rows))
        self.written += [(array.path, array.rows) for array in self._arrays.values()]
        rows = trainer.strategy.reduce(torch.tensor(self._rows), reduce_op="sum")
        for logger in trainer.loggers:
            logger.log_metrics({"predict/rows": int(rows)})

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._close()

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        for array in self._arrays.values():
            array.close()


def refuse(pl_module: LightningModule, rows: int, returned: str) -> NoReturn:
    raise ConfigError(
        f"{type(pl_module).__name__}.predict_step must return a tensor, or a dict of tensors named by "
        f"letters, digits, _ and -, with one output per sample of the batch ({rows}), of one shape in "
        f"every batch; it returned {returned}"
    )


def named_outputs(pl_module: LightningModule, prediction: Any, rows: int) -> dict[str, np.ndarray]:
    """What the ``predict_step`` of a module of your own returned, by name: a tensor is ``output``,
    a dict of tensors gives each its key; as arrays on the CPU, checked to hold one output per
    sample of the batch."""
    named = prediction if isinstance(prediction, dict) else {"output": prediction}
    if not named:
        refuse(pl_module, rows, "an empty dict")
    outputs = {}
    for name, output in named.items():
        key = f"{name!r}: " if isinstance(prediction, dict) else ""
        if not isinstance(name, str) or not OUTPUT_NAME.fullmatch(name):
            refuse(pl_module, rows, f"the key {name!r}")
        if not isinstance(output, torch.Tensor):
            refuse(pl_module, rows, key + ("None" if output is None else f"a {type(output).__name__}"))
        if output.ndim == 0 or len(output) != rows:
            refuse(pl_module, rows, f"{key}a tensor of shape {tuple(output.shape)}")
        output = output.detach().cpu()
        # numpy has no bfloat16: such outputs are written as float32, which holds every one of them.
        outputs[name] = (output.float() if output.dtype == torch.bfloat16 else output).numpy()
    return outputs


class ArrayFile:
    """A ``.npy`` file of shape ``(rows, *shape)``, written a batch of rows at a time. Its header
    is rewritten in place after each batch with the rows written so far, so that the file always
    loads with ``numpy.load``, whatever stops the run, and no batch is held in memory."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.path, self.shape, self.dtype, self.rows = path, shape, dtype, 0
        # Room for a row count of 21 digits, so that the header never grows over the rows.
        self._size = 64 * math.ceil(len(npy_header(dtype, (10**20, *shape))) / 64)
        self._file: IO[bytes] | None = path.open("wb")
        self._write_header()

    def _write_header(self) -> None:
        self._file.seek(0)
        self._file.write(npy_header(self.dtype, (self.rows, *self.shape), self._size))
        self._file.seek(0, io.SEEK_END)
        self._file.flush()

    def append(self, values: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.rows += len(values)
        self._write_header()

    def close(self) -> None:
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


def value_columns(name: str, values: np.ndarray) -> dict[str, list]:
    """``<name>``, one number per sample, or ``<name>0``, ``<name>1``, ..., a vector's numbers, as
    numpy writes them: the shortest text that reads back as the same number."""
    if values.ndim == 1:
        return {name: list(map(str, values))}
    return {f"{name}{n}": list(map(str, column)) for n, column in enumerate(values.T)}


def npy_header(dtype: np.dtype, shape: tuple[int, ...], size: int = 0) -> bytes:
    """The header of a ``.npy`` file (the format's version 1.0) of an array of ``dtype`` and
    ``shape``, padded with spaces to ``size`` bytes."""
    text = repr({"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    padded = text.ljust(size - 11) + "\n"  # after the magic string, the version and the length
    return np.lib.format.magic(1, 0) + struct.pack("<H", len(padded)) + padded.encode("latin1")


def label_columns(data: Any, labels: torch.Tensor | None) -> dict[str, list]:
    """The true label of each sample, for a module of your own: ``label``, named as the data names
    its classes, or ``target`` for a regression target; none where the batches carry no labels,
    or labels of more than one value per sample."""
    if labels is None or labels.ndim != 1:
        return {}
    if getattr(data, "task", None) == "regression":
        return {"target": [f"{t:.7g}" for t in labels.tolist()]}
    classes = getattr(getattr(data, "preprocessing", None), "classes", None)
    return {"label": [classes[c] for c in labels.tolist()] if classes else labels.tolist()}


def regression_columns(predictions: torch.Tensor, targets: torch.Tensor | None) -> dict[str, list]:
    # Seven significant digits: about what float32 holds, without its noise (0.1, not 0.10000000149).
    columns = {} if targets is None else {"target": [f"{t:.7g}" for t in targets.tolist()]}
    columns["prediction"] = [f"{p:.7g}" for p in predictions.tolist()]
    return columns
