"""The train/val/test split (seeded, or in order), the subset and the loaders that every data
module here shares."""

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from sklearn.model_selection import KFold, StratifiedKFold, train_test_split
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from .contract import SupervisedDataModule


class EpochSampler(DistributedSampler):
    """DDP's sampler, drawing an epoch's order when iteration starts rather than when the
    iterator is made: the stateful loader makes it before Lightning calls ``set_epoch``.
    """

    def __iter__(self) -> Iterator[int]:
        yield from super().__iter__()


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    if val_fraction + test_fraction >= 1:
        raise ValueError(
            f"data.val_fraction + data.test_fraction must be below 1, got {val_fraction} + {test_fraction}"
        )


def check_subset(subset: float | None) -> None:
    if subset is not None and subset > 1 and not float(subset).is_integer():
        raise ValueError(f"data.subset must be a fraction below 1 or a whole number of samples, got {subset}")


def subset_size(subset: float | None, size: int) -> int:
    """How many of a split's ``size`` samples ``data.subset`` keeps (all when it is unset)."""
    if subset is None:
        return size
    if subset < 1:
        return max(1, math.ceil(subset * size))
    return min(int(subset), size)


def split_indices(
    size: int, val_fraction: float, test_fraction: float, seed: int, classes: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The indices of ``size`` samples split into train, val and test by ``seed`` alone,
    stratified by ``classes`` when given; scikit-learn's ValueError when a class is too small."""
    holdout = val_fraction + test_fraction
    train, rest = train_test_split(np.arange(size), test_size=holdout, stratify=classes, random_state=seed)
    val, test = train_test_split(
        rest,
        test_size=test_fraction / holdout,
        stratify=None if classes is None else classes[rest],
        random_state=seed,
    )
    return train, val, test


def ordered_indices(
    size: int, val_fraction: float, test_fraction: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The indices of ``size`` samples in order: train first, then val, then test, of the sizes
    that ``split_indices`` gives them (its rounding: the held-out and the test counts rounded up)."""
    holdout = math.ceil((val_fraction + test_fraction) * size)
    test = math.ceil(test_fraction / (val_fraction + test_fraction) * holdout)
    return np.split(np.arange(size), [size - holdout, size - test])


def check_folds(folds: int | None, fold: int) -> None:
    if folds is not None and folds < 2:
        raise ValueError(f"data.init_args.folds must be at least 2 (or null, no folds), got {folds}")
    if folds is not None and fold >= folds:
        raise ValueError(
            f"data.init_args.fold={fold} is no fold of data.init_args.folds={folds}: give 0 to {folds - 1}"
        )


def fold_indices(
    rest: np.ndarray, folds: int, fold: int, seed: int | None, classes: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The train and val indices of fold ``fold`` of ``folds``, cut from ``rest`` (the samples
    outside the test split): in order when ``seed`` is None, else shuffled by ``seed``, stratified
    by ``classes`` (of every sample) when given. Fold k's validation samples are in no other fold's."""
    rest = np.sort(rest)
    if folds > rest.size:
        raise ValueError(
            f"data.init_args.folds={folds} is more than the {rest.size} samples outside the test split; "
            "lower folds"
        )
    if seed is None:
        val = np.array_split(rest, folds)[fold]
        return np.setdiff1d(rest, val), val
    cutter = StratifiedKFold if classes is not None else KFold
    split = cutter(n_splits=folds, shuffle=True, random_state=seed)
    train, val = list(split.split(rest, None if classes is None else classes[rest]))[fold]
    # scikit-learn gives each part in the order of the samples; shuffled, as the split without folds
    # is, so that a subset of a part is drawn from all of it, not from the file's first rows.
    shuffle = np.random.default_rng(seed)
    return rest[shuffle.permutation(train)], rest[shuffle.permutation(val)]


def check_split(
    indices: tuple[np.ndarray, np.ndarray, np.ndarray], size: int, by: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The train, val and test indices of ``size`` samples that ``by`` gave, as arrays; refused
    when a split is empty, when one is not positions of the samples (a mask, numbers out of
    range), or when a sample is in two splits (it would be evaluated on what it trained on)."""
    names = ("train", "val", "test")
    arrays = tuple(np.asarray(split) for split in indices)
    counts = ", ".join(f"{split.size} {name}" for name, split in zip(names, arrays, strict=True))
    for name, split in zip(names, arrays, strict=True):
        if not split.size:
            raise ValueError(
                f"{by} leaves the {name} split empty ({counts} of {size} samples); each split needs samples"
            )
        if split.ndim != 1 or split.dtype.kind not in "iu" or split.min() < 0 or split.max() >= size:
            span = f", from {split.min()} to {split.max()}" if split.dtype.kind in "iufb" else ""
            raise ValueError(
                f"{by} gave {name} indices that are not positions of the {size} samples (0 to {size - 1}): "
                f"a {split.dtype} array of shape {split.shape}{span}"
            )
    repeated = np.flatnonzero(np.bincount(np.concatenate(arrays).astype(np.int64), minlength=size) > 1)
    if repeated.size:
        raise ValueError(
            f"{by} puts samples in more than one split: {repeated.size}, at positions "
            f"{', '.join(map(str, repeated[:3].tolist()))}; each sample belongs to one split"
        )
    return arrays


def loader_seed() -> int:
    """The seed of the loaders' order and augmentation: the training seed."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class SplitDataModule(SupervisedDataModule):
    """Train, val and test splits, served so that a resumed run sees the same batches as one
    that never stopped.

    The shuffled order of an epoch depends only on the seed and the epoch number, as in DDP, and
    the loaders draw from their own generator, never from the global one that dropout uses; the
    training loader can also save and restore its position mid-epoch. A subclass gives each
    split's ``dataset``, and may change ``sampler_class`` (the training sampler) and
    ``loader_options``.
    """

    sampler_class: type[EpochSampler] = EpochSampler
    predict_split = "test"  # the split ``predict`` runs on

    def dataset(self, split: str, train: bool) -> Dataset:
        """The samples of ``split``; augmented, if at all, when ``train``."""
        raise NotImplementedError

    def loader_options(self, processes: int) -> dict[str, Any]:
        """The loaders' ``num_workers``, and any other ``DataLoader`` argument of this data's own,
        with ``processes`` training processes."""
        return {"num_workers": self.hparams.num_workers}

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_split)

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        seed = loader_seed()
        dataset = self.dataset(split, train=shuffle)
        replicas, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        if shuffle:
            sampler = self.sampler_class(dataset, num_replicas=replicas, rank=rank, shuffle=True, seed=seed)
            sampler.set_epoch(self.trainer.current_epoch if self.trainer else 0)
        else:
            # Each process evaluates every replicas-th sample, so each sample counts once in the
            # metrics; DistributedSampler would repeat samples to give the processes equal shares.
            sampler = UnrepeatedDistributedSampler(dataset, num_replicas=replicas, rank=rank, shuffle=False)
        options = self.loader_options(replicas)
        pin_memory = self.hparams.pin_memory
        if pin_memory is None:
            pin_memory = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        loader_class = StatefulDataLoader if shuffle else DataLoader
        return loader_class(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=shuffle and self.hparams.drop_last,
            pin_memory=pin_memory,
            persistent_workers=options["num_workers"] > 0,
            generator=torch.Generator().manual_seed(seed),
            **options,
        )
