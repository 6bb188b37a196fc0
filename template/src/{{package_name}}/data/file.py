"""Your own data from one file in ``data/``: an ``.npz`` archive or a CSV table.

- ``.npz``: an array of features (one row per sample, any trailing shape) under
  ``features_key`` and integer labels ``0..C-1`` under ``labels_key``.
- ``.csv``: a header row, numeric columns, and the integer label in ``label_column``.

``predict --inputs`` reads new samples from a file of the same kind, without labels if need be.

Use it with ``--config configs/data/file.yaml --data.init_args.path data/my_data.npz``.
"""

from pathlib import Path

import numpy as np

from .base import ArrayDataModule, csv_header, read_samples


class FileDataModule(ArrayDataModule):
    """Features and labels read from an .npz or CSV file, split like every ArrayDataModule."""

    def __init__(
        self,
        path: str,
        features_key: str = "features",
        labels_key: str = "labels",
        label_column: str = "label",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.path = Path(path)
        if self.path.suffix not in (".npz", ".csv"):
            raise ValueError(f"data.path must end in .npz or .csv, got {path}")
        if not self.path.is_file():
            raise FileNotFoundError(f"data.path: no such file {path}; put your dataset in data/")
        self.features_key, self.labels_key, self.label_column = features_key, labels_key, label_column

    def load_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        features, labels = read_samples(self.path, self.features_key, self.labels_key, self.label_column)
        if labels is None:
            raise KeyError(self._no_labels())
        if len(features) != len(labels):
            raise ValueError(f"{self.path}: {len(features)} feature rows but {len(labels)} labels")
        return features.astype(np.float32), labels.astype(np.int64)

    def read_predict_file(self, path: Path) -> tuple[np.ndarray, np.ndarray | None]:
        # Columns are matched by position, so a CSV to predict must name them as data.path does.
        if path.suffix == self.path.suffix == ".csv" and path.is_file():
            expected, given = (
                [c for c in csv_header(p) if c != self.label_column] for p in (self.path, path)
            )
            if given != expected:
                raise ValueError(f"{path} has the feature columns {given}; data.path has {expected}")
        return read_samples(path, self.features_key, self.labels_key, self.label_column)

    def _no_labels(self) -> str:
        if self.path.suffix == ".npz":
            with np.load(self.path) as archive:
                return f"{self.path} has no array {self.labels_key!r}; it holds {archive.files}"
        header = csv_header(self.path)
        return f"{self.path} has no column {self.label_column!r}; its columns are {header}"
