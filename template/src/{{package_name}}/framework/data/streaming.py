"""Data larger than memory: LitData's optimised shards, written once by ``scripts/to_shards.py``
and streamed from a local folder or from object storage (``s3://``, ``gs://``, ...) while training.

The shards of ``<input_dir>`` are four LitData datasets: ``train``, ``val`` and ``test``, the
samples of each split, and ``metadata``, a single sample holding the kind of samples (``images``
or ``table``), the task and the ``Preprocessing`` fitted on the training split. A table's samples
are its numeric features as read and its label as a class index (or a regression target); the
model's ``Preprocessing`` standardises them, as for ``FileDataModule``. An image's sample is its
file's bytes, decoded and augmented in the loader's workers as ``ImageFolderDataModule`` does.

The split is the one ``FileDataModule`` and ``ImageFolderDataModule`` make of the same data, and
the preprocessing is fitted on the training split only. A CSV file is read ``CHUNK_ROWS`` rows at
a time, twice: its labels first (the split is stratified by class), then every row, written to
its split's shards while the standardisation is fitted on the training rows. Memory holds one
chunk, a label, a split and an index per row, never the file.

The training loader is LitData's ``StreamingDataLoader``: Lightning saves its position in every
checkpoint, so a run resumed mid-epoch sees the batches it would have seen, with as many loader
workers as before. LitData is an optional dependency: ``pip install -e '.[stream]'``.
"""

import io
import json
import pickle
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from jsonargparse.typing import NonNegativeInt, OpenUnitInterval, PositiveFloat, PositiveInt
from sklearn.preprocessing import StandardScaler
from torch import Tensor
from torchvision.transforms import v2

from ..errors import ConfigError

try:
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming import Cache
    from litdata.streaming.serializers import NoHeaderNumpySerializer
except ImportError:  # an optional dependency: without it the module loads, and says what to install
    StreamingDataLoader = Cache = None
    StreamingDataset = object

from .contract import SupervisedDataModule
from .images import INPUT_DEFAULTS, ImageFolderDataModule, decode_image, default_workers, sample_seed
from .preprocessing import Preprocessing, encode_features, encode_labels, fit
from .splits import loader_seed, split_indices
from .tables import (
    CHUNK_ROWS,
    DataError,
    Table,
    check_header_length,
    check_numeric,
    class_labels,
    csv_text,
    target_values,
    treat_missing,
)

SPLITS = ("train", "val", "test")
# LitData's shard files: large enough to be read in few requests from object storage.
CHUNK_BYTES = "64MB"


def require_litdata() -> None:
    if Cache is None:
        raise ConfigError(
            "Streaming from shards needs litdata: pip install -e '.[stream]' (or pip install litdata)"
        )


def shard_writer(directory: Path) -> Any:
    """A LitData writer of one dataset in ``directory``: ``writer[i] = sample``, then ``finish``."""
    require_litdata()
    return Cache(str(directory), chunk_bytes=CHUNK_BYTES)


def finish(writer: Any) -> None:
    writer.done()
    writer.merge()


def write_metadata(
    output: Path, kind: str, task: str, preprocessing: Preprocessing, counts: np.ndarray
) -> None:
    """The fitted preprocessing and what the model needs to know of the data, as a dataset of one
    sample, so that it is read from wherever the shards are."""
    buffer = io.BytesIO()
    torch.save(
        {
            "kind": kind,
            "task": task,
            "preprocessing": preprocessing.describe(),
            "statistics": preprocessing.state_dict(),
            "class_counts": torch.as_tensor(counts),
        },
        buffer,
    )
    writer = shard_writer(output / "metadata")
    writer[0] = {"metadata": buffer.getvalue()}
    finish(writer)


def images_to_shards(root: Path, output: Path, **split: Any) -> dict[str, int]:
    """Write the images of ``root`` (class folders, or split folders of them) as shards, split as
    ``ImageFolderDataModule`` splits them with the same ``split`` arguments (``val_fraction``,
    ``test_fraction``, ``split_seed``); each split's number of images."""
    images = ImageFolderDataModule(root=str(root), **split)
    classes = images.prepare().classes
    for name in SPLITS:
        writer = shard_writer(output / name)
        for index, (file, label) in enumerate(zip(images.files[name], images.labels[name], strict=True)):
            writer[index] = {"image": Path(file).read_bytes(), "label": label}
        finish(writer)
    counts = np.bincount(images.labels["train"], minlength=len(classes))
    write_metadata(output, "images", "classification", images.preprocessing, counts)
    return {name: len(images.files[name]) for name in SPLITS}


def table_to_shards(
    path: Path,
    output: Path,
    label_column: str = "label",
    task: Literal["classification", "regression"] = "classification",
    standardize: bool = True,
    val_fraction: float = 0.15,
    test_fraction: float = 0.15,
    split_seed: int = 0,
) -> dict[str, int]:
    """Write the rows of a CSV file as shards, split as ``FileDataModule`` splits the file, with
    the standardisation fitted on the training rows; each split's number of rows. Every feature
    must be a number, and no value may be missing."""
    labels, class_values = _read_labels(path, label_column, task)
    splits = split_indices(
        len(labels), val_fraction, test_fraction, split_seed, None if class_values is None else labels
    )
    split_of = np.empty(len(labels), dtype=np.int8)
    for number, rows in enumerate(splits):
        split_of[rows] = number
    # The classes (or the targets' scale) fitted as FileDataModule fits them; the features' next.
    train_labels = labels[splits[0]]
    if class_values is not None:
        train_labels = class_values[np.unique(train_labels)]
    preprocessing = fit(Table(path, np.empty((len(train_labels), 0)), labels=train_labels), task, False)
    scaler = StandardScaler()
    writers = [shard_writer(output / name) for name in SPLITS]
    sizes = [0, 0, 0]
    for start, table in _read_chunks(path, label_column):
        check_numeric(table)
        treat_missing(table, "error", ADVICE)
        features = encode_features(table, preprocessing, "shards").numpy()
        targets = encode_labels(table, preprocessing, task).tolist()
        chunk_splits = split_of[start : start + len(table)]
        if standardize and (chunk_splits == 0).any():
            scaler.partial_fit(table.numeric[chunk_splits == 0])
        for feature, target, split in zip(features, targets, chunk_splits, strict=True):
            writers[split][sizes[split]] = {"features": feature, "label": target}
            sizes[split] += 1
    for writer in writers:
        finish(writer)
    preprocessing.numeric = table.numeric_names
    if standardize:
        preprocessing.mean = torch.tensor(scaler.mean_, dtype=torch.float32)
        preprocessing.scale = torch.tensor(scaler.scale_, dtype=torch.float32)
    counts = np.zeros(0)
    if class_values is not None:  # by the name's index among the classes sorted as text
        by_name = dict(zip(class_values.astype(str), np.bincount(labels[splits[0]]), strict=False))
        counts = np.array([by_name[name] for name in preprocessing.classes])
    write_metadata(output, "table", task, preprocessing, counts)
    return dict(zip(SPLITS, sizes, strict=True))


ADVICE = "fill or drop them before writing shards"


def _read_labels(path: Path, label_column: str, task: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Every row's label, checked: a regression target, or, for classification, the index of its
    class among the class names sorted as text (the order in which the split stratifies), with
    the class values as read, by that index."""
    parts, codes, values = [], {}, {}
    for _, table in _read_chunks(path, label_column, features=False):
        treat_missing(table, "error", ADVICE)
        if task == "regression":
            parts.append(target_values(table))
            continue
        names = class_labels(table)
        for name, value in zip(names, table.labels, strict=True):
            values.setdefault(name, value)
        parts.append(np.array([codes.setdefault(name, len(codes)) for name in names], dtype=np.int64))
    if task == "regression":
        return np.concatenate(parts), None
    names = sorted(codes)
    rank = np.empty(len(names), dtype=np.int64)
    rank[[codes[name] for name in names]] = np.arange(len(names))
    return rank[np.concatenate(parts)], np.array([values[name] for name in names])


def _read_chunks(path: Path, label_column: str, features: bool = True) -> Iterator[tuple[int, Table]]:
    """A CSV file's rows, ``CHUNK_ROWS`` at a time, as tables of numeric features and labels, each
    with the index of its first row; refuses a feature column of text."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    with csv_text(path), path.open(newline="", encoding="utf-8-sig") as file:
        check_header_length(path, file)  # pandas would read a header without a line break whole
        header = list(pd.read_csv(path, nrows=0).columns)
    if label_column not in header:
        raise DataError(f"{path} has no column {label_column!r}; its columns are {header}")
    columns = None if features else [label_column]
    for chunk in _csv_chunks(path, columns):
        start = int(chunk.index[0])
        labels = chunk.pop(label_column).to_numpy()
        numbers = chunk.apply(pd.to_numeric, errors="coerce").to_numpy(np.float64, copy=True)
        text = np.isnan(numbers) & chunk.notna().to_numpy(bool)
        rows = [f"row {start + 2 + i}" for i in range(len(chunk))]  # the header is row 1
        if text.any():
            row, column = np.argwhere(text)[0]
            raise DataError(
                f"{path} {rows[row]}, column {chunk.columns[column]!r}: {chunk.iat[row, column]!r} is not "
                "a number; shards hold numeric features only: encode the column as numbers or drop it"
            )
        yield (
            start,
            Table(path, numbers, list(chunk.columns), labels=labels, label_name=label_column, rows=rows),
        )


def _csv_chunks(path: Path, columns: list[str] | None) -> Iterator[pd.DataFrame]:
    """A CSV file's rows, ``CHUNK_ROWS`` at a time, refused as the table reader refuses a file
    that is not CSV text, wherever in the file its text stops being UTF-8."""
    with csv_text(path):
        yield from pd.read_csv(path, chunksize=CHUNK_ROWS, usecols=columns)


class DamagedShardsError(DataError, ConfigError):
    """Shards that LitData cannot read, found while reading them: the command line prints one
    line, from the main process or from a loader worker."""

    def __init__(self, message: str) -> None:
        # torch re-raises a loader worker's error in the main process as its class, built from
        # "Caught <class> in DataLoader worker process <n>", then the worker's traceback, whose
        # last line is "<module>.<class>: <message>": the message is taken back from it.
        if message.startswith(f"Caught {type(self).__name__} in DataLoader worker"):
            message = message.rstrip().splitlines()[-1].split(": ", 1)[-1]
        super().__init__(message)


def damaged(input_dir: str, what: Any) -> DamagedShardsError:
    """The one line that refuses the shards of ``input_dir``: what is damaged."""
    return DamagedShardsError(
        f"data.input_dir: {input_dir} holds damaged shards: {what}; write them again with python "
        "scripts/to_shards.py"
    )


# What LitData's reader and torch.load raise on bytes that are not what was written.
READING_ERRORS = (struct.error, ValueError, RuntimeError, AssertionError, pickle.UnpicklingError, EOFError)


def unreadable(what: str, error: BaseException) -> str:
    """``what`` cannot be read, with the first line of the reader's error (torch's may be long)."""
    return f"{what} cannot be read ({(str(error) or type(error).__name__).splitlines()[0]})"


class ShardSamples(StreamingDataset):
    """The samples of one split's shards as ``(input, label)`` pairs: a table's features, or an
    image decoded and transformed; with ``shuffle`` (training), each image under the seed of its
    sample and epoch."""

    def __init__(
        self, input_dir: str, split: str, transform: v2.Transform | None, seed: int, **options: Any
    ) -> None:
        super().__init__(_join(input_dir, split), seed=seed, **options)
        self.shards, self.split = input_dir, split
        self.image_transform = transform

    def __getitem__(self, index: Any) -> tuple[Tensor, Tensor | int | float]:
        try:
            sample = super().__getitem__(index)
        except READING_ERRORS as error:
            number = getattr(index, "index", index)  # LitData's loader passes a ChunkedIndex
            raise damaged(self.shards, unreadable(f"{self.split} sample {number}", error)) from None
        if self.image_transform is None:
            return torch.from_numpy(sample["features"]), sample["label"]
        image = decode_image(
            io.BytesIO(sample["image"]), f"{self.input_dir.url or self.input_dir.path}[{index}]"
        )
        if not self.shuffle:
            return self.image_transform(image), sample["label"]
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(sample_seed(self.seed, self.current_epoch, index.index))
            return self.image_transform(image), sample["label"]


def read_metadata(input_dir: str, cache_dir: str | None) -> dict[str, Any]:
    """What ``write_metadata`` wrote in ``input_dir``, local or remote."""
    try:
        sample = StreamingDataset(_join(input_dir, "metadata"), cache_dir=cache_dir)[0]
        return torch.load(io.BytesIO(sample["metadata"]), weights_only=True)
    except READING_ERRORS as error:
        raise damaged(input_dir, unreadable("metadata", error)) from None


def check_shards(input_dir: str) -> None:
    """Refuse local shards that are missing or damaged when the data module is built, before a run
    starts, rather than in LitData's loader mid-run: each dataset's index.json is read and checked,
    and each chunk it lists must be there, of its size, holding its number of samples, with their
    offsets in LitData's layout. A sample's own bytes are only checked when it is read."""
    try:
        formats = {name: _check_dataset(Path(input_dir), name) for name in ("metadata", *SPLITS)}
        _check_formats(formats)
    except DataError as damage:
        raise damaged(input_dir, damage) from None


def _check_dataset(root: Path, name: str) -> Any:
    """The chunks of one dataset, checked against its index.json; its data_format."""
    index = root / name / "index.json"
    if not index.is_file():
        raise FileNotFoundError(
            f"data.input_dir: {root} holds no LitData shards ({name}/index.json is missing); write them "
            "with python scripts/to_shards.py"
        )
    try:
        described = json.loads(index.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # not UTF-8 or not JSON; nested past Python's limit
        raise DataError(f"{name}/index.json is not JSON ({error})") from None
    chunks = described.get("chunks") if isinstance(described, dict) else None
    config = described.get("config") if isinstance(described, dict) else None
    if not (isinstance(chunks, list) and all(map(_is_chunk, chunks)) and isinstance(config, dict)):
        raise DataError(f"{name}/index.json is not a LitData index (its chunks, then its config)")
    if not chunks:
        raise DataError(f"{name}/index.json lists no chunks; to_shards.py writes at least one")
    _check_config(name, config)
    for chunk in chunks:
        where, path = f"{name}/{chunk['filename']}", root / name / chunk["filename"]
        if not path.is_file():
            raise DataError(f"{where}, listed in {name}/index.json, is missing")
        size = path.stat().st_size
        if size != chunk["chunk_bytes"]:
            raise DataError(f"{where} is {size:,} bytes; {name}/index.json says {chunk['chunk_bytes']:,}")
        with path.open("rb") as file:  # a chunk starts with its number of samples, then their offsets
            count = int.from_bytes(file.read(4), "little")
            offsets = file.read(4 * (count + 1)) if size >= 4 * (count + 2) else b""
        if count != chunk["chunk_size"]:
            says = chunk["chunk_size"]
            raise DataError(f"{where} holds {count:,} samples by its header; {name}/index.json says {says:,}")
        if not _offsets_fit(offsets, count, size):
            raise DataError(f"{where}'s table of where its samples start and end is damaged")
    return config.get("data_format")


def _check_config(name: str, config: dict) -> None:
    """What LitData reads of an index.json's config before any sample, as to_shards.py writes it:
    no compression, and the samples' structure (data_spec) as JSON."""
    if config.get("compression") is not None:
        raise DataError(
            f"{name}/index.json's compression is {config['compression']!r}; to_shards.py writes none (null)"
        )
    try:
        json.loads(config.get("data_spec"))
    except (TypeError, ValueError, RecursionError):
        raise DataError(f"{name}/index.json's data_spec is not JSON") from None


def _offsets_fit(table: bytes, count: int, size: int) -> bool:
    """Whether a chunk's offsets (the count+1 after its number of samples) are LitData's layout:
    the first sample starts after them, each ends where the next starts, the last at the end."""
    if len(table) != 4 * (count + 1):
        return False
    offsets = np.frombuffer(table, dtype="<u4").astype(np.int64)
    return bool(offsets[0] == 4 * (count + 2) and (np.diff(offsets) >= 0).all() and offsets[-1] == size)


def _is_chunk(chunk: Any) -> bool:
    """Whether an entry of index.json's chunks is one LitData writes: a file in the dataset's folder,
    of at least a header's 4 bytes, and its number of samples."""
    if not (isinstance(chunk, dict) and isinstance(chunk.get("filename"), str)):
        return False
    name, size, count = chunk["filename"], chunk.get("chunk_bytes"), chunk.get("chunk_size")
    numbers = all(
        isinstance(value, int) and not isinstance(value, bool) and value >= 0 for value in (size, count)
    )
    return numbers and size >= 4 and name not in ("", "..") and Path(name).name == name


def _check_formats(formats: dict[str, Any]) -> None:
    """Each dataset's data_format (LitData's names of its fields' serializers) as to_shards.py
    writes it: the metadata's bytes; and, alike in every split, an image's bytes or a table's
    float32 features, then a class index or a target."""
    features = NoHeaderNumpySerializer().serialize(np.zeros(0, np.float32))[1]
    written = [[inputs, label] for inputs in ("bytes", features) for label in ("int", "float")]
    for name, data_format in formats.items():
        # The metadata holds bytes; train, any format to_shards.py writes; val and test, train's.
        expected = {"metadata": [["bytes"]], "train": written}.get(name, [formats["train"]])
        if data_format not in expected:
            raise DataError(
                f"{name}/index.json's data_format is {data_format}; to_shards.py writes "
                f"{' or '.join(map(str, expected))}"
            )


def _join(input_dir: str, name: str) -> str:
    return f"{input_dir.rstrip('/')}/{name}"


class StreamingDataModule(SupervisedDataModule):
    """Train, val and test splits streamed from the shards that ``scripts/to_shards.py`` wrote,
    from a local folder or a URL that LitData reads (``s3://bucket/shards``, ``gs://...``).

    The training order is shuffled by the training seed and the epoch; LitData splits each epoch
    between the processes and their loader workers, and its ``StreamingDataLoader`` keeps the
    position, which Lightning saves in checkpoints. Images are augmented as
    ``ImageFolderDataModule`` augments them, each under a seed drawn from the training seed, the
    epoch and the sample, so a resumed run augments as one that never stopped.

    Args:
        input_dir: the folder or URL of the shards (``train``, ``val``, ``test``, ``metadata``).
        cache_dir: where shards read from a URL are kept while training; by default LitData's.
        batch_size: samples per batch on each process.
        num_workers: loader worker processes that read and decode; by default one fewer than the
            CPUs available to each process, at least 1 and at most 8.
        pin_memory: page-locked host memory for faster copies to a GPU; by default on exactly
            when training on a GPU.
        image_size, crop_scale, flip, color_jitter, mean, std, interpolation: for images, as
            ``ImageFolderDataModule`` takes them.
    """

    predict_split = "test"

    def __init__(
        self,
        input_dir: str = "data/shards",
        cache_dir: str | None = None,
        batch_size: PositiveInt = 64,
        num_workers: NonNegativeInt | None = None,
        pin_memory: bool | None = None,
        image_size: PositiveInt | None = None,
        crop_scale: tuple[OpenUnitInterval, float] | None = (0.08, 1.0),
        flip: bool = True,
        color_jitter: float = 0.0,
        mean: tuple[float, float, float] | None = None,
        std: tuple[PositiveFloat, PositiveFloat, PositiveFloat] | None = None,
        interpolation: Literal["bilinear", "bicubic", "nearest"] | None = None,
    ) -> None:
        super().__init__()
        require_litdata()
        # Checked here, not in setup: the parser refuses the shards in one line before the run's
        # directory is made and before DDP starts its ranks (each would print the line). The check
        # reads each chunk's count and offsets (4 bytes a sample), never the samples.
        if "://" not in input_dir:  # shards in object storage are read as LitData reads them
            check_shards(input_dir)
        self.save_hyperparameters()
        for key, default in INPUT_DEFAULTS.items():
            if self.hparams.get(key) is None:
                self.hparams[key] = default
        self.batch_size = batch_size
        self.metadata: dict[str, Any] | None = None

    def prepare(self) -> Preprocessing:
        """Read the metadata of the shards; once."""
        if self.preprocessing is None:
            self.metadata = read_metadata(self.hparams.input_dir, self.hparams.cache_dir)
            self.preprocessing = Preprocessing()
            self.preprocessing.load_state_dict(self.metadata["statistics"])
            self.preprocessing.restore(self.metadata["preprocessing"])
        return self.preprocessing

    @property
    def task(self) -> str:
        self.prepare()
        return self.metadata["task"]

    @property
    def num_classes(self) -> int | None:
        return len(self.prepare().classes) if self.task == "classification" else None

    @property
    def num_features(self) -> int:
        if self.prepare() and self.metadata["kind"] == "images":
            return 3 * self.hparams.image_size**2
        return self.preprocessing.output_size((len(self.preprocessing.numeric),))

    @property
    def class_counts(self) -> np.ndarray | None:
        return self.prepare() and self.metadata["class_counts"].numpy()

    def setup(self, stage: str) -> None:
        self.prepare()

    # The same transforms as ImageFolderDataModule's, from the same hyper-parameters.
    transform = ImageFolderDataModule.transform

    def train_dataloader(self) -> Any:
        return self._loader("train", train=True)

    def val_dataloader(self) -> Any:
        return self._loader("val")

    def test_dataloader(self) -> Any:
        return self._loader("test")

    def predict_dataloader(self) -> Any:
        return self._loader("test")

    def _loader(self, split: str, train: bool = False) -> Any:
        hparams = self.hparams
        transform = self.transform(train) if self.metadata["kind"] == "images" else None
        dataset = ShardSamples(
            hparams.input_dir,
            split,
            transform,
            loader_seed(),
            cache_dir=hparams.cache_dir,
            shuffle=train,
        )
        processes = self.trainer.world_size if self.trainer else 1
        workers = default_workers(processes) if hparams.num_workers is None else hparams.num_workers
        pin_memory = hparams.pin_memory
        if pin_memory is None:
            pin_memory = self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        # Plain ints: the loader's state, saved in checkpoints, holds them, and a checkpoint loads
        # with weights_only=True, which refuses jsonargparse's PositiveInt.
        return StreamingDataLoader(
            dataset,
            batch_size=int(self.batch_size),
            num_workers=int(workers),
            pin_memory=pin_memory,
            persistent_workers=workers > 0,
            # The workers' seed is drawn from this generator, not from the global one that dropout
            # uses, whose state a resumed run restores before its loader starts.
            generator=torch.Generator().manual_seed(loader_seed()),
        )
