"""Splitting and loading shared by every dataset that fits in memory as a feature and a label array."""

import inspect
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from jsonargparse.typing import NonNegativeInt, OpenUnitInterval, PositiveFloat, PositiveInt
from lightning.pytorch import LightningDataModule
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.utilities import rank_zero_warn
from sklearn.model_selection import train_test_split
from torch import Tensor, nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, default_convert
from torchdata.stateful_dataloader import StatefulDataLoader

from ..errors import ConfigError, message_of
from . import preprocessing
from .preprocessing import Preprocessing
from .tables import DataError, Table, check_numeric, class_labels, read_table, target_values

BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


class EpochSampler(DistributedSampler):
    """DDP's sampler, drawing an epoch's order when iteration starts rather than when the
    iterator is made: the stateful loader makes it before Lightning calls ``set_epoch``.
    """

    def __iter__(self) -> Iterator[int]:
        yield from super().__iter__()


class TensorBatches(TensorDataset):
    """A ``TensorDataset`` that serves a batch by indexing each tensor once, rather than one
    sample at a time followed by stacking the samples (the loader's ``collate_fn`` is then
    ``default_convert``, which leaves the batch as it is).
    """

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, ...]:
        index = torch.as_tensor(indices)
        return tuple(tensor[index] for tensor in self.tensors)


class ArrayDataModule(LightningDataModule):
    """Train/val/test split of ``load_table()`` (by default ``load_arrays()``), preprocessed, with
    an optional subset for smoke runs.

    The split is stratified by class for classification, and depends only on ``split_seed``, never
    on the training seed, so every run of a project evaluates on the same samples. The
    preprocessing (see ``preprocessing.py``) is fitted on the training split only and saved in
    checkpoints, with the model and with this data module's state. The constrained types
    (``PositiveInt`` and the like) make the CLI refuse an impossible value at start-up, naming
    its key.

    Args:
        batch_size: samples per batch on each process.
        val_fraction: share of the data held out for validation.
        test_fraction: share of the data held out for testing.
        split_seed: seed of the split.
        subset: keep only part of each split: below 1 a fraction (0.1 keeps a tenth), from 1 on a
            number of samples (64 keeps 64).
        num_workers: DataLoader worker processes. In-memory arrays are served fastest by the main
            process, which indexes a whole batch at once (digits at batch 64: about 40 us a batch,
            over 1 ms with one or two workers, which pass each batch between processes); raise
            it for datasets that decode or augment in ``__getitem__``.
        pin_memory: page-locked host memory for faster copies to a GPU; by default on exactly
            when training on a GPU.
        drop_last: leave out each epoch's last, incomplete training batch (the samples left out
            change from epoch to epoch, as the order does).
        predict_path: a file of samples for ``predict`` instead of the test split (``predict
            --inputs`` sets it), read by ``read_predict_table``; labels, if the file has them,
            become ``label`` in ``predictions.csv``.
        standardize: standardise each numeric feature with the training split's mean and
            standard deviation.
    """

    task: Literal["classification", "regression"] = "classification"

    def __init__(
        self,
        batch_size: PositiveInt = 64,
        val_fraction: OpenUnitInterval = 0.15,
        test_fraction: OpenUnitInterval = 0.15,
        split_seed: int = 0,
        subset: PositiveFloat | None = None,
        num_workers: NonNegativeInt = 0,
        pin_memory: bool | None = None,
        drop_last: bool = False,
        predict_path: str | None = None,
        standardize: bool = False,
    ) -> None:
        super().__init__()
        if subset is not None and subset > 1 and not float(subset).is_integer():
            raise ValueError(
                f"data.subset must be a fraction below 1 or a whole number of samples, got {subset}"
            )
        if val_fraction + test_fraction >= 1:
            raise ValueError(
                "data.val_fraction + data.test_fraction must be below 1, "
                f"got {val_fraction} + {test_fraction}"
            )
        self.save_hyperparameters()
        # LightningCLI saves only the arguments it passes, and evaluating a checkpoint passes the
        # data settings saved in it: a checkpoint older than an argument (v0.2.0's lack drop_last,
        # predict_path and standardize) leaves that argument at its default, which is saved here.
        arguments = locals()
        for name in inspect.signature(ArrayDataModule).parameters:
            self.hparams.setdefault(name, arguments[name])
        self.batch_size = batch_size
        self.table: Table | None = None  # every sample, as loaded
        self.preprocessing: Preprocessing | None = None  # fitted on the training split
        # Each split's samples as rows of the table, e.g. the rows of a data file.
        self.rows: dict[str, np.ndarray] = {}
        self.splits: dict[str, TensorBatches] = {}

    def load_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Return all features (one row per sample) and labels (classes, or regression targets)."""
        raise NotImplementedError

    def load_table(self) -> Table:
        """Every sample, read and checked; by default ``load_arrays()``'s."""
        features, labels = self.load_arrays()
        rows = [f"sample {i}" for i in range(len(features))]
        names = [f"feature {i}" for i in range(int(np.prod(np.shape(features)[1:])))]
        table = Table(
            Path(type(self).__name__), np.asarray(features, np.float64), names, labels=labels, rows=rows
        )
        check_numeric(table)
        return table

    def read_predict_table(self, path: Path) -> Table:
        """The samples of ``predict_path`` (labels optional); see ``tables.read_table``."""
        return read_table(path)

    @property
    def predict_split(self) -> str:
        """The split ``predict`` runs on: the samples of ``predict_path`` if given, else the test split."""
        return "predict" if self.hparams.predict_path else "test"

    @property
    def num_classes(self) -> int | None:
        """The number of classes in the training split (None for regression)."""
        return len(self.prepare().classes) if self.task == "classification" else None

    @property
    def num_features(self) -> int:
        """The number of features the network receives, after preprocessing."""
        return self.prepare().output_size(self.table.numeric.shape[1:])

    @property
    def class_counts(self) -> np.ndarray:
        """The number of training samples of each class, by class index."""
        labels = preprocessing.encode_labels(self.table.take(self.rows["train"]), self.prepare(), self.task)
        return np.bincount(labels.numpy(), minlength=len(self.preprocessing.classes))

    def prepare(self) -> Preprocessing:
        """Load, check and split the data, and fit the preprocessing on the training split; once."""
        if self.preprocessing is not None:
            return self.preprocessing
        try:
            self.table = table = self.load_table()
            if table.labels is None:
                raise DataError(f"{table.source} has no labels ({table.label_name!r})")
            train, val, test = self._split(table)
            self.preprocessing = preprocessing.fit(table.take(train), self.task, self.hparams.standardize)
        except (KeyError, FileNotFoundError, ValueError) as error:  # missing, unreadable or inconsistent
            raise ConfigError(message_of(error)) from error
        for name, split in {"train": train, "val": val, "test": test}.items():
            self.rows[name] = split[: self._subset_size(len(split))]
        return self.preprocessing

    def _split(self, table: Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        hparams = self.hparams
        holdout = hparams.val_fraction + hparams.test_fraction
        # Every label is checked, whichever split it falls in.
        classes = class_labels(table) if self.task == "classification" else None
        if classes is None:
            target_values(table)
        indices = np.arange(len(table))
        try:
            train, rest = train_test_split(
                indices, test_size=holdout, stratify=classes, random_state=hparams.split_seed
            )
            val, test = train_test_split(
                rest,
                test_size=hparams.test_fraction / holdout,
                stratify=None if classes is None else classes[rest],
                random_state=hparams.split_seed,
            )
        except ValueError as error:
            if classes is None:
                raise
            names, counts = np.unique(classes, return_counts=True)
            rarest = names[counts.argmin()]
            rows = [table.rows[i] for i in np.flatnonzero(classes == rarest)[:3]]
            raise DataError(
                f"{table.source}, column {table.label_name!r}: the class {str(rarest)!r} has only "
                f"{counts.min()} sample{'s' if counts.min() > 1 else ''} ({', '.join(rows)}), too few to be "
                f"split by class into train, val and test ({error}); add samples, or drop or merge the "
                "rarest classes"
            ) from None
        return train, val, test

    def setup(self, stage: str) -> None:
        if self.splits:
            return
        self.prepare()
        self._encode()
        self._check_batch_size()

    def _encode(self) -> None:
        """The splits as tensors, by the current preprocessing (fitted, or restored from a checkpoint)."""
        tables = {name: self.table.take(rows) for name, rows in self.rows.items() if name != "predict"}
        if self.hparams.predict_path:
            tables["predict"] = self._predict_table(Path(self.hparams.predict_path))
        for name, table in tables.items():
            try:
                tensors = [preprocessing.encode_features(table, self.preprocessing, name)]
                if table.labels is not None:
                    tensors.append(preprocessing.encode_labels(table, self.preprocessing, self.task))
            except DataError as error:
                raise ConfigError(("--inputs: " if name == "predict" else "") + str(error)) from error
            self.splits[name] = TensorBatches(*tensors)

    def _predict_table(self, path: Path) -> Table:
        try:
            table = preprocessing.align(self.read_predict_table(path), self.preprocessing, self.table)
        except (KeyError, FileNotFoundError, ValueError) as error:
            raise ConfigError(f"--inputs: {message_of(error)}") from error
        if len(table) == 0:
            raise ConfigError(f"--inputs: {path} holds no samples")
        self.rows["predict"] = np.arange(len(table))
        return table

    def state_dict(self) -> dict[str, Any]:
        if self.preprocessing is None:
            return {}
        return {"preprocessing": self.preprocessing.describe(), "statistics": self.preprocessing.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # The preprocessing a checkpoint was trained with, in case the data file has changed since.
        if "preprocessing" not in state_dict or self.preprocessing is None:
            return
        saved = Preprocessing()
        saved.load_state_dict(state_dict["statistics"])
        saved.restore(state_dict["preprocessing"])
        if not saved.same_as(self.preprocessing):
            self.preprocessing = saved
            self.splits.clear()
            self._encode()

    def _check_batch_size(self) -> None:
        """Refuse a batch size that leaves a process nothing to train on, or a last batch of one
        sample that BatchNorm cannot train on; warn when the batches of an epoch do not fill the
        last gradient-accumulation window.
        """
        processes = self.trainer.world_size if self.trainer else 1
        samples = math.ceil(len(self.splits["train"]) / processes)  # the sampler pads to equal shares
        on_each = f" on each of the {processes} processes" if processes > 1 else ""
        if self.batch_size > samples:
            raise ConfigError(
                f"data.batch_size={self.batch_size} is larger than the {samples} training samples"
                f"{on_each}; lower the batch size or enlarge data.subset"
            )
        last = 0 if self.hparams.drop_last else samples % self.batch_size
        model = self.trainer.lightning_module if self.trainer else None
        batch_norm = model is not None and any(isinstance(layer, BATCH_NORMS) for layer in model.modules())
        if last == 1 and batch_norm:
            raise ConfigError(
                f"data.batch_size={self.batch_size} leaves a last training batch of 1 sample{on_each} "
                f"({samples} samples), on which BatchNorm cannot train; choose another batch size "
                "or set data.drop_last=true"
            )
        batches = samples // self.batch_size + (last > 0)
        accumulate = self.trainer.accumulate_grad_batches if self.trainer else 1
        if batches % accumulate:
            rank_zero_warn(
                f"{batches} training batches per epoch{on_each} is not a multiple of "
                f"trainer.accumulate_grad_batches={accumulate}: the last optimizer step of each epoch "
                f"sums {batches % accumulate} batches, so its gradient is {batches % accumulate}/"
                f"{accumulate} of a full one"
            )

    def _subset_size(self, size: int) -> int:
        subset = self.hparams.subset
        if subset is None:
            return size
        if subset < 1:
            return max(1, math.ceil(subset * size))
        return min(int(subset), size)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_split)

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        pin_memory = self.hparams.pin_memory
        if pin_memory is None:
            pin_memory = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        dataset = self.splits[split]
        # The shuffled order of an epoch depends only on the seed and the epoch number, as in
        # DDP, and the loaders draw from their own generator, never from the global one that
        # dropout uses; the training loader can also save and restore its position mid-epoch.
        # Together they let a resumed run see the same batches as one that never stopped.
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        replicas, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        if shuffle:
            sampler = EpochSampler(dataset, num_replicas=replicas, rank=rank, shuffle=True, seed=seed)
            sampler.set_epoch(self.trainer.current_epoch if self.trainer else 0)
        else:
            # Each process evaluates every replicas-th sample, so each sample counts once in the
            # metrics; DistributedSampler would repeat samples to give the processes equal shares.
            sampler = UnrepeatedDistributedSampler(dataset, num_replicas=replicas, rank=rank, shuffle=False)
        loader_class = StatefulDataLoader if shuffle else DataLoader
        return loader_class(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=shuffle and self.hparams.drop_last,
            collate_fn=default_convert,
            num_workers=self.hparams.num_workers,
            pin_memory=pin_memory,
            persistent_workers=self.hparams.num_workers > 0,
            generator=torch.Generator().manual_seed(seed),
        )
