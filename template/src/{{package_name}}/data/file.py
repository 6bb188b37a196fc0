"""Your own data from one file in ``data/``: a CSV table or an ``.npz`` archive.

- ``.csv``: a header row, then one row per sample. The label is in ``label_column``: class names
  or whole numbers for classification, numbers for regression. Columns of numbers are numeric
  features; columns of text are categorical features, one-hot encoded.
- ``.npz``: an array of features (one row per sample, any trailing shape) under
  ``features_key`` and the labels under ``labels_key``.

The numeric features are standardised, the categories and the classes found, on the training
split only; ``predict --inputs`` reads new samples from a file of the same kind, labels optional,
and preprocesses them in the same way. Every value is checked as it is read (see ``tables.py``).

Use it with ``--config configs/data/file.yaml --data.init_args.path data/my_data.csv``.
"""

import csv
from pathlib import Path
from typing import Literal

import numpy as np

from .base import ArrayDataModule
from .tables import DataError, Table, read_table


class FileDataModule(ArrayDataModule):
    """Features and labels read from a CSV or .npz file, split like every ArrayDataModule.

    Args:
        path: the data file.
        label_column: the CSV column that holds the labels.
        features_key: the .npz array that holds the features.
        labels_key: the .npz array that holds the labels.
        task: ``classification`` (labels are classes) or ``regression`` (labels are numbers).
        standardize: standardise the numeric features (on by default for a file).
    """

    def __init__(
        self,
        path: str,
        label_column: str = "label",
        features_key: str = "features",
        labels_key: str = "labels",
        task: Literal["classification", "regression"] = "classification",
        standardize: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(standardize=standardize, **kwargs)
        self.path = Path(path)
        if self.path.suffix not in (".npz", ".csv"):
            raise ValueError(f"data.path must end in .npz or .csv, got {path}")
        if not self.path.is_file():
            raise FileNotFoundError(f"data.path: no such file {path}; put your dataset in data/")
        self.task = task
        self.label_column, self.features_key, self.labels_key = label_column, features_key, labels_key

    def load_table(self) -> Table:
        table = self.read_predict_table(self.path)
        if table.labels is not None:
            return table
        if self.path.suffix == ".npz":
            with np.load(self.path) as archive:
                raise DataError(f"{self.path} has no array {self.labels_key!r}; it holds {archive.files}")
        with self.path.open(newline="") as file:
            header = next(csv.reader(file))
        raise DataError(f"{self.path} has no column {self.label_column!r}; its columns are {header}")

    def read_predict_table(self, path: Path) -> Table:
        return read_table(path, self.label_column, self.features_key, self.labels_key)
