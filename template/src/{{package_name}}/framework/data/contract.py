"""What a data module gives the rest of the project (its task, sizes, classes and preprocessing),
written down once as ``SupervisedDataModule``."""

from typing import Any, Literal, NamedTuple

import numpy as np
from lightning.pytorch import LightningDataModule
from torch import Tensor

from .preprocessing import Preprocessing


class SupervisedDataModule(LightningDataModule):
    """A data module of labelled samples that tells the model what it needs to know of them.

    Every data module in ``data/`` is one: ``ArrayDataModule``, ``ImageFolderDataModule`` and
    their subclasses. The command line builds a data module of this kind (``gives_sizes``) from
    ``data.init_args`` before the model, and reads its ``task``, ``num_features`` and
    ``num_classes``: they become the sizes the config leaves unset
    (``model.init_args.num_classes``, the network's ``in_features``, ``num_classes`` and
    ``num_outputs``), and a size set by hand that differs from the data's is refused. The run
    then uses that same data module, so the data is read once.

    A subclass gives:

    - ``task``: ``classification`` (labels are class indices) or ``regression`` (labels are
      numbers); a model of the other task is refused (``framework/models/base.py``'s ``check_task``).
    - ``batch_size``: samples per batch on each process; the model's effective batch size and
      ``scale_lr`` are reckoned from it.
    - ``num_features``: the number of values the network receives per sample.
    - ``num_classes``: the number of classes, None for regression; a classifier refuses another
      ``model.init_args.num_classes``.
    - ``preprocessing``: after ``setup``, the ``Preprocessing`` fitted on the training split,
      class names in its ``classes``. The model takes a copy as its first module, so that its
      checkpoints and exports take raw features, and names the classes with it.

    and, where it has them (the defaults here say it has not):

    - ``class_counts``: the training samples of each class, which
      ``model.init_args.class_weights=balanced`` needs;
    - ``missing_values``: what became of missing values, for the experiment record;
    - ``sample_columns``: the columns of ``predictions.csv`` that say where each sample came from;
    - a ``predict_path`` argument: the samples that ``predict --inputs`` gives it (a file of
      rows, or images); batches of new samples that may leave some out are ``PredictBatch``;
    - ``vocab_size`` and ``max_length``: a text module's, the tokens its tokenizer knows and the
      most a text keeps, which become a network's arguments of those names where it has them;
    - ``restore_fitted``: what a checkpoint's run fitted, taken before the sizes are read;
    - ``use_weights_preprocessing``: what the weights of ``--weights`` need of the preprocessing.

    Its arguments are saved with ``save_hyperparameters()``, so that ``test`` and ``predict``
    rebuild it from a checkpoint as it was trained.

    Any other ``LightningDataModule`` also trains, but without size inference: the command line
    reads no sizes from it, so the config sets the model's and the network's sizes itself (a
    ``Classifier`` without ``num_classes`` is refused). The model and the callbacks read the
    names above of it where it has them, and need its ``batch_size``.
    """

    task: Literal["classification", "regression"]
    batch_size: int
    preprocessing: Preprocessing | None = None
    missing_values: dict[str, Any] | None = None

    @property
    def num_features(self) -> int:
        """The number of values the network receives per sample, after preprocessing."""
        raise NotImplementedError

    @property
    def num_classes(self) -> int | None:
        """The number of classes (None for regression)."""
        raise NotImplementedError

    @property
    def class_counts(self) -> np.ndarray | None:
        """The number of training samples of each class, by class index."""
        return None

    def restore_fitted(self, state: dict[str, Any]) -> None:
        """Take what the run of a checkpoint fitted on its training split, ``state`` (the
        checkpoint's copy of this module's ``state_dict``), before the sizes are read, so that a
        test, a predict or a resumed fit uses it rather than fitting it again. By default nothing:
        a table's preprocessing, quick to fit, is fitted and then replaced by ``load_state_dict``."""

    def use_weights_preprocessing(self, described: dict[str, Any], path: str) -> None:
        """Take what the weights of ``--weights path`` were trained with and cannot be trained
        without, from ``described`` (that checkpoint's ``Preprocessing.describe()``, empty for a
        plain ``state_dict``), before the sizes are read. By default nothing: a table's
        statistics and classes are fitted on this data."""

    def sample_columns(self, indices: list[int]) -> dict[str, list]:
        """Columns of ``predictions.csv`` naming the samples at ``indices`` of the predicted split
        (their rows in the data, their files), one value per sample."""
        return {}


class PredictBatch(NamedTuple):
    """A batch of new samples to predict, from a loader that may leave some out (an unreadable
    image, skipped): the inputs, and each one's index among the samples asked for."""

    inputs: Tensor
    indices: Tensor


def gives_sizes(data_class: object) -> bool:
    """Whether the command line reads the sizes of the data from a data module of ``data_class``
    (a ``SupervisedDataModule``) rather than taking them from the config."""
    return isinstance(data_class, type) and issubclass(data_class, SupervisedDataModule)
