"""Images on disk, one folder per class (torchvision's ``ImageFolder`` layout), decoded and
augmented in loader worker processes; and new images to predict, from a folder, a file or a glob.

What a random augmentation draws depends only on the seed, the epoch and the sample's index:
each sample is transformed under a random state made from those three, never from a worker's
own stream. So the number of workers, which worker serves a sample, and a resume in the middle
of an epoch leave every augmented image as it would have been.
"""

import glob
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
import torch
from jsonargparse.typing import NonNegativeInt, OpenUnitInterval, PositiveFloat, PositiveInt
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset, default_collate
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset
from torchvision.transforms import v2

from ..errors import ConfigError
from .contract import PredictBatch
from .preprocessing import Preprocessing
from .splits import (
    EpochSampler,
    SplitDataModule,
    check_fractions,
    check_subset,
    loader_seed,
    split_indices,
    subset_size,
)

SPLITS = ("train", "val", "test")
# The input of a network that does not say its own: ImageNet's statistics, at its usual size.
INPUT_DEFAULTS = {
    "image_size": 224,
    "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225),
    "interpolation": "bilinear",
}
# Evaluation resizes the shorter side to the crop size over this ratio, then crops the centre.
CENTRE_CROP_RATIO = 0.875
# The value of a white pixel in Pillow's modes of more than 8 bits, whose convert() would clip at 255
# instead of scaling: 16-bit grey (PNG, TIFF), 32-bit integer grey (16-bit PNG files in older
# Pillow), and floating-point grey, taken in [0, 1] as torchvision takes float images.
WHITE = {"I;16": 65535, "I;16B": 65535, "I;16L": 65535, "I": 65535, "F": 1.0}
# Pillow's errors for a corrupt file, and for an image over its limit of MAX_IMAGE_PIXELS.
DECODING_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    Image.DecompressionBombError,
    Image.DecompressionBombWarning,
)


class UnreadableImageError(ConfigError):
    """An image that cannot be decoded. Raised in a loader worker, it reaches the main process as
    torch re-raises it there: the same class, with the worker's traceback before the message."""

    def __str__(self) -> str:
        last = super().__str__().rstrip().splitlines()[-1]
        return last.removeprefix(f"{type(self).__module__}.{type(self).__qualname__}: ")


def read_image(path: str) -> Tensor:
    """An image file as a 3 x H x W uint8 tensor, read as torchvision's ``ImageFolder`` reads it
    (with Pillow): grey and RGBA images are converted to RGB, and grey images of more than 8 bits
    are scaled to 8. An image over Pillow's limit of ``Image.MAX_IMAGE_PIXELS`` is unreadable."""
    try:
        with open(path, "rb") as file:
            return decode_image(file, path)
    except OSError as error:
        raise UnreadableImageError(f"{path} is not a readable image ({error.strerror})") from None


def decode_image(file: BinaryIO, name: str) -> Tensor:
    """An image file's bytes, read as ``read_image`` reads a file; ``name`` names it in the error."""
    try:
        with warnings.catch_warnings():
            # Pillow only warns up to twice its limit, then refuses: both are refused here.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return v2.functional.pil_to_tensor(to_rgb(Image.open(file)))
    except DECODING_ERRORS as error:
        first_line = (str(error) or type(error).__name__).splitlines()[0]
        reason = re.sub(r" <_io\.\w+ .*>$", "", first_line)  # Pillow names the file object
        raise UnreadableImageError(f"{name} is not a readable image ({reason})") from None


def to_rgb(image: Image.Image) -> Image.Image:
    """An image in Pillow's RGB mode, grey pixels of more than 8 bits scaled from ``WHITE``."""
    if image.mode in WHITE:
        pixels = np.asarray(image, dtype=np.float32) * (255 / WHITE[image.mode])
        image = Image.fromarray(np.clip(pixels.round(), 0, 255).astype(np.uint8))
    return image.convert("RGB")


def is_image(path: str, root: Path) -> bool:
    """A file of an image's extension, in no hidden folder (``.ipynb_checkpoints``) and not
    hidden itself (macOS's ``._*`` files)."""
    relative = Path(path).relative_to(root)
    return path.lower().endswith(IMG_EXTENSIONS) and not any(part.startswith(".") for part in relative.parts)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one sample's augmentation in one epoch."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1)[0])


class ImageFiles(Dataset):
    """Image files and their class indices. A key ``(index, epoch)`` augments under the seed of
    that sample and epoch; a plain index transforms without randomness (evaluation)."""

    def __init__(self, files: list[str], labels: list[int], transform: v2.Transform, seed: int) -> None:
        self.files, self.labels, self.transform, self.seed = files, labels, transform, seed

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[Tensor, int]:
        index, epoch = key if isinstance(key, tuple) else (key, None)
        image = read_image(self.files[index])
        if epoch is None:
            return self.transform(image), self.labels[index]
        with torch.random.fork_rng(devices=[]):
            # The CPU generator only: torch.manual_seed would also queue the seeding of CUDA.
            torch.default_generator.manual_seed(sample_seed(self.seed, epoch, index))
            return self.transform(image), self.labels[index]


class NewImages(Dataset):
    """Image files to predict, each served with its index. An unreadable one stops the run with
    its path, or, with ``skip``, is left out with one line naming it (``ReadableBatches``)."""

    def __init__(self, files: list[str], transform: v2.Transform, skip: bool) -> None:
        self.files, self.transform, self.skip = files, transform, skip

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Tensor, int] | None:
        try:
            return self.transform(read_image(self.files[index])), index
        except UnreadableImageError as error:
            if not self.skip:
                raise
            print(f"Skipping an unreadable image: {error}", file=sys.stderr)
            return None


class ReadableBatches:
    """The loader's ``collate_fn`` for ``NewImages``: a ``PredictBatch`` of the images that could
    be read (an empty one of the right shape when none could)."""

    def __init__(self, image_size: int) -> None:
        self.image_size = image_size

    def __call__(self, samples: list[tuple[Tensor, int] | None]) -> PredictBatch:
        read = [sample for sample in samples if sample is not None]
        if not read:
            empty = torch.empty(0, 3, self.image_size, self.image_size)
            return PredictBatch(empty, torch.empty(0, dtype=torch.long))
        return PredictBatch(*default_collate(read))


def find_images(path: str) -> list[str]:
    """The images ``predict --inputs`` names, sorted: an image file, every image under a folder at
    any depth, or the images a glob matches (``**`` matches folders at any depth)."""
    if any(char in path for char in "*?["):
        found = [name for name in glob.glob(path, recursive=True) if os.path.isfile(name)]
        found = [name for name in found if name.lower().endswith(IMG_EXTENSIONS)]
    elif os.path.isdir(path):
        root = Path(path)
        found = [str(name) for name in root.rglob("*") if name.is_file() and is_image(str(name), root)]
    elif os.path.isfile(path):
        if not path.lower().endswith(IMG_EXTENSIONS):
            raise ConfigError(
                f"--inputs: {path} is not an image file ({', '.join(IMG_EXTENSIONS)}); "
                "this model predicts images: give an image, a folder of them or a glob"
            )
        found = [path]
    else:
        raise ConfigError(f"--inputs: no such file or folder: {path}")
    if not found:
        raise ConfigError(f"--inputs: {path} holds no images ({', '.join(IMG_EXTENSIONS)})")
    return sorted(found)


class SeededEpochSampler(EpochSampler):
    """DDP's shuffled sampler, yielding each index with the epoch it is drawn in."""

    def __iter__(self):
        epoch = self.epoch
        for index in super().__iter__():
            yield index, epoch


class ImageFolderDataModule(SplitDataModule):
    """A folder of images, one subfolder per class, split into train, val and test.

    With ``train/``, ``val/`` and ``test/`` subfolders in ``root``, each is a split, and each
    must hold every class. Otherwise ``root`` holds the class folders, and the split is
    stratified by class, seeded by ``split_seed`` apart from the training seed. Files whose
    extension is not an image's are ignored.

    ``predict --inputs`` gives it new images (``predict_path``): a file, a folder of them at any
    depth, or a glob. They go through the evaluation transform, and need no ``root``: the
    checkpoint knows the classes.

    Args:
        root: the folder of images.
        image_size: the side, in pixels, of the square images the network receives; by default
            the network's own (a backbone's, from timm), else 224.
        batch_size: samples per batch on each process.
        val_fraction: share of the images held out for validation (without split folders).
        test_fraction: share of the images held out for testing (without split folders).
        split_seed: seed of the split.
        subset: keep only part of each split: below 1 a fraction, from 1 on a number of images.
        crop_scale: training crops cover this range of each image's area, at random, and are
            resized to ``image_size``; null resizes and crops the centre, as evaluation does.
        flip: flip training images left to right half of the time.
        color_jitter: strength of random changes to brightness, contrast and saturation in
            training (0: none).
        mean: per-channel mean subtracted after scaling pixels to [0, 1]; by default the
            network's own, else ImageNet's.
        std: per-channel standard deviation divided by after that; by default the network's
            own, else ImageNet's.
        interpolation: how images are resized: bilinear, bicubic or nearest; by default the
            network's own, else bilinear.
        num_workers: loader worker processes that decode and augment; by default one fewer than
            the CPUs available to each process, at least 1 and at most 8.
        pin_memory: page-locked host memory for faster copies to a GPU; by default on exactly
            when training on a GPU.
        drop_last: leave out each epoch's last, incomplete training batch.
        skip_unreadable: leave out the images that cannot be decoded, found by decoding every
            image once at the start, and say how many; by default such an image stops the run
            with its path. In ``predict --inputs``, each is left out as it is met, with a line
            naming it.
        predict_path: new images for ``predict`` instead of the test split (``predict --inputs``
            sets it): an image file, a folder, or a glob.
    """

    task = "classification"
    sampler_class = SeededEpochSampler

    def __init__(
        self,
        root: str = "data/images",
        image_size: PositiveInt | None = None,
        batch_size: PositiveInt = 64,
        val_fraction: OpenUnitInterval = 0.15,
        test_fraction: OpenUnitInterval = 0.15,
        split_seed: int = 0,
        subset: PositiveFloat | None = None,
        crop_scale: tuple[OpenUnitInterval, float] | None = (0.08, 1.0),
        flip: bool = True,
        color_jitter: float = 0.0,
        mean: tuple[float, float, float] | None = None,
        std: tuple[PositiveFloat, PositiveFloat, PositiveFloat] | None = None,
        interpolation: Literal["bilinear", "bicubic", "nearest"] | None = None,
        num_workers: NonNegativeInt | None = None,
        pin_memory: bool | None = None,
        drop_last: bool = False,
        skip_unreadable: bool = False,
        predict_path: str | None = None,
    ) -> None:
        super().__init__()
        check_subset(subset)
        if crop_scale is not None and not 0 < crop_scale[0] <= crop_scale[1] <= 1:
            raise ValueError(f"data.crop_scale must be two fractions, low to high, got {list(crop_scale)}")
        if not 0 <= color_jitter < 1:
            raise ValueError(f"data.color_jitter must be in [0, 1), got {color_jitter}")
        check_fractions(val_fraction, test_fraction)
        self.save_hyperparameters()
        # What a network does not set (settings.use_network_input) takes these.
        for key, default in INPUT_DEFAULTS.items():
            if self.hparams.get(key) is None:
                self.hparams[key] = default
        self.batch_size = batch_size
        self.files: dict[str, list[str]] = {}
        self.labels: dict[str, list[int]] = {}
        self.preprocessing: Preprocessing | None = None  # only the class names: images need no fitting

    @property
    def classes(self) -> list[str]:
        return self.prepare().classes

    @property
    def num_classes(self) -> int | None:
        """The classes in ``root``; None when predicting new images, whose checkpoint knows them."""
        return None if self.hparams.predict_path else len(self.classes)

    @property
    def predict_split(self) -> str:
        return "predict" if self.hparams.predict_path else "test"

    @property
    def num_features(self) -> int:
        """The values in one image the network receives, for a network that flattens it."""
        return 3 * self.hparams.image_size**2

    def prepare(self) -> Preprocessing:
        """Find the images, check the classes, and split; once."""
        if self.preprocessing is not None:
            return self.preprocessing
        root = Path(self.hparams.root)
        if not root.is_dir():
            raise ConfigError(f"data.root: no such folder {root}; put your images in class folders there")
        if all((root / split).is_dir() for split in SPLITS):
            classes, found = self._split_folders(root)
        else:
            classes, samples = self._class_folders(root)
            found = self._split([path for path, _ in samples], [label for _, label in samples])
        if len(classes) == 1:  # every prediction would be right, and every metric perfect
            raise ConfigError(
                f"{root} holds one class, {classes[0]}: a classifier needs two or more; "
                "add a folder for each other class"
            )
        if self.hparams.skip_unreadable:
            paths = sorted(path for files, _ in found.values() for path in files)
            unreadable = _unreadable(paths)
            found = {split: _without(files, labels, unreadable) for split, (files, labels) in found.items()}
        for split, (files, labels) in found.items():
            size = subset_size(self.hparams.subset, len(files))
            self.files[split], self.labels[split] = files[:size], labels[:size]
        self.preprocessing = Preprocessing()
        self.preprocessing.classes = classes
        return self.preprocessing

    def _class_folders(self, root: Path) -> tuple[list[str], list[tuple[str, int]]]:
        """The class names and every image under ``root``, refusing a class folder without one."""
        classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and entry.name[0] != ".")
        if not classes:
            raise ConfigError(
                f"{root} has no class folders: put each class's images in a folder named after it"
            )
        class_to_index = {name: index for index, name in enumerate(classes)}
        samples = make_dataset(
            str(root), class_to_index, is_valid_file=lambda path: is_image(path, root), allow_empty=True
        )
        counts = np.bincount([label for _, label in samples], minlength=len(classes))
        if (counts == 0).any():
            empty = [classes[i] for i in np.flatnonzero(counts == 0)]
            raise ConfigError(
                f"{root}: the class folders {empty} hold no images ({', '.join(IMG_EXTENSIONS)}); "
                "add images or remove the folders"
            )
        return classes, samples

    def _split_folders(self, root: Path) -> tuple[list[str], dict[str, tuple[list[str], list[int]]]]:
        found, classes = {}, None
        for split in SPLITS:
            names, samples = self._class_folders(root / split)
            if classes is not None and names != classes:
                missing = sorted(set(classes) ^ set(names))
                raise ConfigError(
                    f"{root}: the splits hold different classes: {missing} are not in every one of "
                    f"{', '.join(f'{s}/' for s in SPLITS)}; each split needs a folder for each class"
                )
            classes = names
            order = np.random.default_rng(self.hparams.split_seed).permutation(len(samples))
            found[split] = ([samples[i][0] for i in order], [samples[i][1] for i in order])
        return classes, found

    def _split(self, files: list[str], labels: list[int]) -> dict[str, tuple[list[str], list[int]]]:
        hparams = self.hparams
        labels_array = np.asarray(labels)
        try:
            splits = split_indices(
                len(files), hparams.val_fraction, hparams.test_fraction, hparams.split_seed, labels_array
            )
        except ValueError as error:
            raise ConfigError(
                f"{hparams.root}: too few images in a class to split it by class into train, val and "
                f"test ({error}); add images, or use train/, val/ and test/ folders"
            ) from None
        return {
            split: ([files[i] for i in rows], [labels[i] for i in rows])
            for split, rows in zip(SPLITS, splits, strict=True)
        }

    def setup(self, stage: str) -> None:
        if stage == "predict" and self.hparams.predict_path:
            self.files["predict"] = find_images(self.hparams.predict_path)
            return
        self.prepare()
        for split in SPLITS:
            if not self.files[split]:
                raise ConfigError(f"{self.hparams.root}: the {split} split holds no images")

    def transform(self, train: bool) -> v2.Transform:
        """Training: the configured augmentation; evaluation: resize and centre crop only. Both end
        in float pixels normalised by ``mean`` and ``std``."""
        hparams = self.hparams
        size, interpolation = hparams.image_size, v2.InterpolationMode(hparams.interpolation)
        if train and hparams.crop_scale is not None:
            scale = tuple(hparams.crop_scale)
            steps = [v2.RandomResizedCrop(size, scale=scale, interpolation=interpolation, antialias=True)]
        else:
            resize = v2.Resize(round(size / CENTRE_CROP_RATIO), interpolation=interpolation, antialias=True)
            steps = [resize, v2.CenterCrop(size)]
        if train and hparams.flip:
            steps.append(v2.RandomHorizontalFlip())
        if train and hparams.color_jitter:
            jitter = hparams.color_jitter
            steps.append(v2.ColorJitter(brightness=jitter, contrast=jitter, saturation=jitter))
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(hparams.mean), list(hparams.std))]
        return v2.Compose(steps)

    def dataset(self, split: str, train: bool) -> ImageFiles | NewImages:
        if split == "predict":
            return NewImages(self.files[split], self.transform(train=False), self.hparams.skip_unreadable)
        return ImageFiles(self.files[split], self.labels[split], self.transform(train), loader_seed())

    def loader_options(self, processes: int) -> dict[str, Any]:
        workers = self.hparams.num_workers
        options = {"num_workers": default_workers(processes) if workers is None else workers}
        if self.hparams.predict_path:
            options["collate_fn"] = ReadableBatches(self.hparams.image_size)
        return options

    def sample_columns(self, indices: list[int]) -> dict[str, list]:
        """``file``: each sample's image file."""
        return {"file": [self.files[self.predict_split][i] for i in indices]}


def default_workers(processes: int) -> int:
    """One fewer than the CPUs available to each training process, at least 1 and at most 8."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cpus // processes - 1))


def _without(files: list[str], labels: list[int], left_out: frozenset[str]) -> tuple[list[str], list[int]]:
    kept = [i for i, path in enumerate(files) if path not in left_out]
    return [files[i] for i in kept], [labels[i] for i in kept]


def _unreadable(paths: list[str]) -> frozenset[str]:
    """The images among ``paths`` that cannot be decoded, with a line saying how many."""
    unreadable = set()
    for path in paths:
        try:
            read_image(path)
        except UnreadableImageError:
            unreadable.add(path)
    if unreadable:
        count = f"{len(unreadable)} unreadable image{'s' if len(unreadable) > 1 else ''}"
        rank_zero_info(f"Skipping {count}, e.g. {min(unreadable)}")
    return frozenset(unreadable)
