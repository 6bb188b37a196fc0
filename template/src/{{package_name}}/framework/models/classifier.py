"""The LightningModule that trains a classification network: cross-entropy, accuracy and macro-F1."""

from typing import Literal

import torch
from jsonargparse.typing import PositiveInt
from sklearn.utils.class_weight import compute_class_weight
from torch import Tensor, nn
from torch.nn import functional

from ..errors import ConfigError
from .base import SupervisedModule
from .parts import classification_metrics


class Classifier(SupervisedModule):
    """Cross-entropy training, with optional label smoothing and class weights; accuracy and
    macro-F1 on every split. ``predict`` returns the class probabilities.

    Args:
        network: the ``nn.Module`` mapping a batch of inputs to class logits.
        num_classes: number of classes; by default the data's. Also given to the network.
        label_smoothing: the share of each target's probability spread over all classes (0: none).
        class_weights: the weight of each class in the training loss, by class index, or
            ``balanced``: inversely proportional to the class's share of the training split, for
            imbalanced data. The validation and test loss stay unweighted cross-entropy.
        **kwargs: optimizer and schedule, see ``SupervisedModule``.
    """

    task = "classification"

    def __init__(
        self,
        network: nn.Module,
        num_classes: PositiveInt | None = None,
        label_smoothing: float = 0.0,
        class_weights: list[float] | Literal["balanced"] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(network, **kwargs)
        if num_classes is None:
            raise ConfigError(
                "model.init_args.num_classes is not set, and the data module does not give it; set it"
            )
        if not 0 <= label_smoothing < 1:
            raise ConfigError(f"model.init_args.label_smoothing must be in [0, 1), got {label_smoothing}")
        if isinstance(class_weights, list) and (
            len(class_weights) != num_classes or not all(w >= 0 and w < float("inf") for w in class_weights)
        ):
            raise ConfigError(
                f"model.init_args.class_weights must be {num_classes} non-negative numbers, one per class, "
                f"or balanced; got {class_weights}"
            )
        weights = class_weights if isinstance(class_weights, list) else [1.0] * num_classes
        self.register_buffer("class_weight", torch.tensor(weights, dtype=torch.float32), persistent=False)
        self.init_metrics(classification_metrics(num_classes))

    @property
    def class_names(self) -> list[str]:
        """The classes' names, by class index (their indices for a model trained before names)."""
        return self.preprocess.classes or [str(c) for c in range(self.hparams.num_classes)]

    def setup(self, stage: str) -> None:
        super().setup(stage)
        data = self.trainer.datamodule
        classes = getattr(data, "num_classes", None)
        if classes is not None and classes != self.hparams.num_classes:
            raise ConfigError(
                f"The data has {classes} classes but model.init_args.num_classes is "
                f"{self.hparams.num_classes}; leave it unset to take it from the data"
            )
        if self.hparams.class_weights == "balanced":
            counts = getattr(data, "class_counts", None)
            if counts is None:
                raise ConfigError("model.init_args.class_weights=balanced needs the data's class counts")
            present = counts.nonzero()[0]
            labels = torch.arange(len(counts)).repeat_interleave(torch.as_tensor(counts)).numpy()
            weights = torch.ones(len(counts))
            weights[present] = torch.tensor(
                compute_class_weight("balanced", classes=present, y=labels)
            ).float()
            self.class_weight.copy_(weights)

    def objective(self, logits: Tensor, targets: Tensor) -> Tensor:
        # Unweighted unless weights were asked for: the weighted loss costs each step more.
        weight = None if self.hparams.class_weights is None else self.class_weight.to(logits.dtype)
        return functional.cross_entropy(
            logits,
            targets,
            weight=weight,
            label_smoothing=self.hparams.label_smoothing,
            reduction="none",
        )

    def evaluation_loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return functional.cross_entropy(logits, targets, reduction="none")

    def metric_inputs(self, logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        return logits.argmax(dim=1), targets

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        return self(batch[0]).softmax(dim=-1)
