"""Preprocessing fitted on the training split only, and carried by the model.

The data module reads a file into a ``Table``, fits a ``Preprocessing`` on the training split's
samples and encodes every split with it: numeric features stay as they are (NaN where missing),
each categorical one becomes the index of its category, class labels become class indices. The
model holds the same ``Preprocessing`` as its first module, so the imputation of missing numbers,
the standardisation and the one-hot encoding are in its checkpoint and in every export, which
therefore take raw features; the class names and the categories are saved with it.
"""

from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from torch import Tensor, nn

from .tables import DataError, Table, class_labels, such, target_values


class Preprocessing(nn.Module):
    """Raw features to the network's inputs, and regression targets to and from the scale the
    network learns (standardised on the training split).

    Its input is a float batch: the numeric features (any trailing shape when there are no
    categorical ones), NaN where missing, then one column per categorical feature holding the
    category's index in ``categories[name]``, or -1 for a category not seen in training, which
    encodes as all zeros. Fitted with imputation, a missing number becomes the training split's
    ``median``, and each numeric feature in ``indicators`` (by position) adds an input that is 1
    where it was missing. Unfitted, it passes its input through unchanged, as it passes a text
    model's token ids: their ``tokenizer`` (``framework/data/text.py``) is kept here, so that the
    model's checkpoint encodes new texts as its training texts were.
    """

    def __init__(self) -> None:
        super().__init__()
        for name in ("median", "mean", "scale", "target_mean", "target_scale"):
            self.register_buffer(name, torch.zeros(0))
        self.numeric: list[str] = []  # the numeric features' names
        self.indicators: list[int] = []  # the numeric features whose missing values are an input too
        self.categories: dict[str, list[str]] = {}  # each categorical feature's categories
        self.classes: list[str] = []  # the class names, by class index
        self.tokenizer: str | None = None  # a text model's tokenizer, as the JSON of Hugging Face tokenizers

    def forward(self, x: Tensor) -> Tensor:
        width = len(self.numeric)
        numeric = x[:, :width] if self.categories else x
        # Where numbers are missing is only looked for when something uses it (every step pays for it).
        missing = torch.isnan(numeric) if self.median.numel() or self.indicators else None
        if self.median.numel():
            numeric = torch.where(missing, self.median, numeric)
        if self.mean.numel():
            numeric = (numeric - self.mean) / self.scale
        if not (self.categories or self.indicators):
            return numeric
        indicators = [missing.flatten(1)[:, self.indicators].to(x.dtype)] if self.indicators else []
        one_hot = [
            (x[:, width + j, None] == torch.arange(len(values), device=x.device)).to(x.dtype)
            for j, values in enumerate(self.categories.values())
        ]
        return torch.cat([numeric.flatten(1), *indicators, *one_hot], dim=1)

    def scale_targets(self, targets: Tensor) -> Tensor:
        return (targets - self.target_mean) / self.target_scale if self.target_mean.numel() else targets

    def unscale_targets(self, outputs: Tensor) -> Tensor:
        return outputs * self.target_scale + self.target_mean if self.target_mean.numel() else outputs

    def output_size(self, input_shape: tuple[int, ...]) -> int:
        """The number of features the network receives for samples of ``input_shape``."""
        numeric = int(np.prod(input_shape)) if not self.categories else len(self.numeric)
        return numeric + len(self.indicators) + sum(len(values) for values in self.categories.values())

    def describe(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the buffers: the features' names, the indicators, the
        categories, the classes and the tokenizer."""
        return {
            "numeric": self.numeric,
            "indicators": self.indicators,
            "categories": self.categories,
            "classes": self.classes,
            "tokenizer": self.tokenizer,
        }

    def restore(self, description: dict[str, Any]) -> None:
        self.numeric = description["numeric"]
        self.indicators = description["indicators"]
        self.categories = description["categories"]
        self.classes = description["classes"]
        self.tokenizer = description.get("tokenizer")  # checkpoints before text have none

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # The statistics' sizes come from the data: take the saved ones.
        for name, buffer in self.named_buffers(recurse=False):
            saved = state_dict.get(prefix + name)
            if isinstance(saved, Tensor) and saved.shape != buffer.shape:
                setattr(self, name, torch.empty(saved.shape, dtype=buffer.dtype, device=buffer.device))
        super()._load_from_state_dict(state_dict, prefix, *args)

    def same_as(self, other: "Preprocessing") -> bool:
        mine, theirs = self.state_dict(), other.state_dict()
        same_buffers = all(torch.equal(value, theirs[key]) for key, value in mine.items())
        return same_buffers and self.describe() == other.describe()


def fit(
    train: Table, task: str, standardize: bool, impute: bool = False, indicators: bool = False
) -> Preprocessing:
    """Fit the preprocessing on the training split's samples (never on the others: their
    statistics would leak into training). With ``impute``, a missing number becomes the median of
    its feature, and the standardisation is fitted on the imputed values; with ``indicators`` too,
    each feature with a missing value in the training split adds an input that says where."""
    preprocessing = Preprocessing()
    preprocessing.numeric = list(train.numeric_names)
    numeric, shape = train.numeric.reshape(len(train), -1), train.numeric.shape[1:]
    missing = np.isnan(numeric)
    if impute and numeric.size:
        empty = np.flatnonzero(missing.all(axis=0))
        if len(empty):
            raise DataError(
                f"{train.source}, column {train.numeric_names[empty[0]]!r}: no value in the "
                f"{len(train)} rows of the training split, so no median to impute; drop the column"
            )
        median = np.nanmedian(numeric, axis=0)
        preprocessing.median = torch.tensor(median, dtype=torch.float32).reshape(shape)
        numeric = np.where(missing, median, numeric)
        if indicators:
            preprocessing.indicators = np.flatnonzero(missing.any(axis=0)).tolist()
    if standardize and numeric.size:
        scaler = StandardScaler().fit(numeric)
        preprocessing.mean = torch.tensor(scaler.mean_, dtype=torch.float32).reshape(shape)
        preprocessing.scale = torch.tensor(scaler.scale_, dtype=torch.float32).reshape(shape)
    if train.categorical_names:
        encoder = OneHotEncoder().fit(train.categorical)
        preprocessing.categories = {
            name: [str(value) for value in values]
            for name, values in zip(train.categorical_names, encoder.categories_, strict=True)
        }
    if train.labels is None:
        return preprocessing
    if task == "classification":
        names = class_labels(train)
        numeric = train.labels.dtype.kind in "iuf"
        preprocessing.classes = sorted(
            set(names.tolist()), key=lambda name: (int(name),) if numeric else (name,)
        )
    else:
        targets = target_values(train)
        preprocessing.target_mean = torch.tensor([targets.mean()], dtype=torch.float32)
        preprocessing.target_scale = torch.tensor([targets.std() or 1.0], dtype=torch.float32)
    return preprocessing


def encode_features(table: Table, preprocessing: Preprocessing, split: str) -> Tensor:
    """The model's input for the table's samples: numeric features, then category indices.
    Categories not seen in training become -1 (all zeros once one-hot encoded); their count is
    printed."""
    numeric = torch.as_tensor(table.numeric, dtype=torch.float32)
    if not preprocessing.categories:
        return numeric
    codes = np.empty(table.categorical.shape, dtype=np.float32)
    unseen = []
    for j, (name, values) in enumerate(preprocessing.categories.items()):
        index = {value: i for i, value in enumerate(values)}
        codes[:, j] = [index.get(value, -1) for value in table.categorical[:, j]]
        missing = table.categorical[codes[:, j] < 0, j]
        if len(missing):
            shown = ", ".join(repr(value) for value in sorted(set(missing.tolist()))[:3])
            unseen.append(f"{len(missing)} in column {name!r} ({shown})")
    if unseen:
        rank_zero_info(
            f"{split}: values not seen in training, encoded as all zeros: "
            f"{'; '.join(unseen)} ({table.source})"
        )
    return torch.cat([numeric, torch.from_numpy(codes)], dim=1)


def encode_labels(table: Table, preprocessing: Preprocessing, task: str) -> Tensor:
    """Class indices by the training split's classes, or regression targets as float32."""
    if task != "classification":
        return torch.as_tensor(target_values(table), dtype=torch.float32)
    names = class_labels(table)
    index = {name: i for i, name in enumerate(preprocessing.classes)}
    unknown = [i for i, name in enumerate(names) if name not in index]
    if unknown:
        first = unknown[0]
        raise DataError(
            f"{table.where(first, table.label_name)}: the label {str(names[first])!r} is not among the "
            f"classes of the training split {preprocessing.classes[:10]}; {such(len(unknown), 'label')}"
        )
    return torch.as_tensor([index[name] for name in names], dtype=torch.int64)


def align(table: Table, preprocessing: Preprocessing, trained_on: Table) -> Table:
    """The table's features in the order and kinds the model was trained on, matched by column
    name; refuses a missing column or one of another kind."""
    if table.source.suffix != ".csv" or trained_on.source.suffix != ".csv":
        if table.numeric.shape[1:] != trained_on.numeric.shape[1:] or table.categorical_names:
            raise DataError(
                f"{table.source} holds samples of shape {table.numeric.shape[1:]}; the model was trained "
                f"on samples of shape {trained_on.numeric.shape[1:]}"
            )
        return table
    numeric = dict(zip(table.numeric_names, table.numeric.T, strict=True))
    categorical = dict(zip(table.categorical_names, table.categorical.T, strict=True))
    expected = [*preprocessing.numeric, *preprocessing.categories]
    missing = [name for name in expected if name not in numeric and name not in categorical]
    if missing:
        raise DataError(f"{table.source} lacks the columns {missing} that the model was trained on")
    text = [name for name in preprocessing.numeric if name in categorical]
    if text:
        raise DataError(f"{table.source}: the columns {text} hold text; in training they held numbers")
    columns = [numeric[name] for name in preprocessing.numeric]
    as_text = [
        categorical.get(name, numeric.get(name, np.empty(0)).astype(str)) for name in preprocessing.categories
    ]
    return Table(
        table.source,
        np.column_stack(columns) if columns else np.empty((len(table), 0)),
        list(preprocessing.numeric),
        np.column_stack(as_text) if as_text else np.empty((len(table), 0), dtype=str),
        list(preprocessing.categories),
        table.labels,
        table.label_name,
        table.rows,
    )
