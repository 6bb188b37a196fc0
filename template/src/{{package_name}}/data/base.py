"""Splitting and loading shared by every dataset that fits in memory as a feature and a label array."""

import csv
import inspect
import math
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path

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

BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def csv_header(path: Path) -> list[str]:
    """The column names in the first row of a CSV file (empty for an empty file)."""
    with path.open(newline="") as file:
        return next(csv.reader(file), [])


def read_samples(
    path: Path, features_key: str = "features", labels_key: str = "labels", label_column: str = "label"
) -> tuple[np.ndarray, np.ndarray | None]:
    """Features, one row per sample, and labels (``None`` when the file has none) from a file:

    - ``.npy``: the features alone;
    - ``.npz``: the features under ``features_key``, the labels, if any, under ``labels_key``;
    - ``.csv``: a header row and numeric columns, the labels, if any, in ``label_column``.
    """
    if path.suffix not in (".npy", ".npz", ".csv"):
        raise ValueError(f"{path} is not a .npy, .npz or .csv file")
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    if path.suffix == ".csv":
        return _read_csv(path, label_column)
    try:
        if path.suffix == ".npy":
            return np.load(path), None
        with np.load(path) as archive:
            if features_key not in archive.files:
                raise KeyError(f"{path} has no array {features_key!r}; it holds {archive.files}")
            labels = archive[labels_key] if labels_key in archive.files else None
            return archive[features_key], labels
    except (OSError, EOFError, ValueError, zipfile.BadZipFile):
        raise ValueError(f"{path} is not a readable NumPy {path.suffix} file") from None


def _read_csv(path: Path, label_column: str) -> tuple[np.ndarray, np.ndarray | None]:
    with path.open(newline="") as file:
        rows = csv.reader(file)
        header, first_sample = next(rows, None), next(rows, None)
    if header is None or first_sample is None:
        raise ValueError(f"{path} has no samples: it needs a header row, then one row per sample")
    try:
        table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    except ValueError as error:
        raise ValueError(f"{path} is not a table of numbers under one header row: {error}") from None
    if label_column not in header:
        return table, None
    label = header.index(label_column)
    return np.delete(table, label, axis=1), table[:, label]


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
    """Stratified train/val/test split of ``load_arrays()``, with an optional subset for smoke runs.

    The split depends only on ``split_seed``, never on the training seed, so every run of a
    project evaluates on the same samples. The constrained types (``PositiveInt`` and the like)
    make the CLI refuse an impossible value at start-up, naming its key.

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
        predict_path: a file of samples for ``predict`` to classify instead of the test split
            (``predict --inputs`` sets it), read by ``read_predict_file``: features in the form
            ``load_arrays`` returns them; labels, if the file has them, become ``label`` in
            ``predictions.csv``.
    """

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
        # data settings saved in it: a checkpoint older than an argument (v0.2.0's lack drop_last
        # and predict_path) leaves that argument at its default, which is saved here.
        arguments = locals()
        for name in inspect.signature(ArrayDataModule).parameters:
            self.hparams.setdefault(name, arguments[name])
        self.batch_size = batch_size
        self.splits: dict[str, TensorBatches] = {}
        self.num_classes: int | None = None
        # Each split's samples as rows of load_arrays(), e.g. the rows of a data file.
        self.rows: dict[str, np.ndarray] = {}

    def load_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Return all features (one row per sample) and integer class labels."""
        raise NotImplementedError

    def read_predict_file(self, path: Path) -> tuple[np.ndarray, np.ndarray | None]:
        """Features and labels (or ``None``) of the samples in ``predict_path``; see ``read_samples``."""
        return read_samples(path)

    @property
    def predict_split(self) -> str:
        """The split ``predict`` classifies: the samples of ``predict_path`` if given, else the test split."""
        return "predict" if self.hparams.predict_path else "test"

    def setup(self, stage: str) -> None:
        if self.splits:
            return
        try:
            features, labels = self.load_arrays()
        except (KeyError, FileNotFoundError, ValueError) as error:  # missing, unreadable or inconsistent
            raise ConfigError(message_of(error)) from error
        self.num_classes = int(labels.max()) + 1
        hparams = self.hparams
        indices = np.arange(len(labels))
        train, holdout = train_test_split(
            indices,
            test_size=hparams.val_fraction + hparams.test_fraction,
            stratify=labels,
            random_state=hparams.split_seed,
        )
        val, test = train_test_split(
            holdout,
            test_size=hparams.test_fraction / (hparams.val_fraction + hparams.test_fraction),
            stratify=labels[holdout],
            random_state=hparams.split_seed,
        )
        features, labels = torch.as_tensor(features), torch.as_tensor(labels)
        for name, split in {"train": train, "val": val, "test": test}.items():
            kept = split[: self._subset_size(len(split))]
            self.splits[name] = TensorBatches(features[kept], labels[kept])
            self.rows[name] = kept
        if self.hparams.predict_path:
            self._add_predict_split(Path(self.hparams.predict_path), features)
        self._check_batch_size()

    def _add_predict_split(self, path: Path, trained_on: Tensor) -> None:
        try:
            features, labels = self.read_predict_file(path)
        except (KeyError, FileNotFoundError, ValueError) as error:
            raise ConfigError(f"--inputs: {message_of(error)}") from error
        if features.shape[1:] != trained_on.shape[1:]:
            raise ConfigError(
                f"--inputs: {path} holds samples of shape {features.shape[1:]}; the model was trained "
                f"on samples of shape {tuple(trained_on.shape[1:])}"
            )
        if len(features) == 0:
            raise ConfigError(f"--inputs: {path} holds no samples")
        not_finite = np.flatnonzero(~np.isfinite(features).reshape(len(features), -1).all(axis=1))
        if len(not_finite):
            raise ConfigError(
                f"--inputs: {len(not_finite)} samples of {path} have values that are NaN or infinite "
                f"(rows {not_finite[:5].tolist()}{', ...' if len(not_finite) > 5 else ''})"
            )
        tensors = [torch.as_tensor(features, dtype=trained_on.dtype)]
        if labels is not None:
            if len(labels) != len(features):
                raise ConfigError(f"--inputs: {path} holds {len(features)} samples but {len(labels)} labels")
            classes = range(self.num_classes or 0)
            wrong = [label.item() for label in np.unique(labels) if label not in classes]
            if wrong:
                raise ConfigError(
                    f"--inputs: labels must be the classes 0 to {classes.stop - 1}; {path} has {wrong[:5]}"
                )
            tensors.append(torch.as_tensor(labels, dtype=torch.int64))
        self.splits["predict"] = TensorBatches(*tensors)
        self.rows["predict"] = np.arange(len(features))

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
