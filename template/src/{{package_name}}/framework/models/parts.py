"""The parts the template's LightningModules are built from, each doing one thing, for a module of
your own as well (``models/example.py`` is one, its steps in plain view):

- ``optimizer_class`` and ``build_optimizer``: a ``torch.optim`` optimizer by name, checked at
  start-up against its arguments, then built on the module's parameters;
- ``warmup_then_decay`` and ``start_schedules``: the learning rate of every step, a linear warm-up
  then a cosine, linear or no decay over the run (``lr_factor``), resumed at the right rate;
- ``classification_metrics`` and ``regression_metrics``: the metrics each task reports;
- ``logs_this_step`` and ``check_finite``: a run stops on a non-finite loss, read only on the
  steps the loggers write;
- ``take_preprocessing``: the preprocessing the data module fitted on the training split, which
  the module then carries in its checkpoint.
"""

import importlib
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from ..data.preprocessing import Preprocessing
from ..errors import ConfigError


def optimizer_class(name: str, arguments: dict[str, Any], weight_decay: float) -> type[Optimizer]:
    """The optimizer class called ``name`` in ``torch.optim``, or at a dotted path, checked
    against the ``arguments`` and ``weight_decay`` it will be given."""
    module, _, attribute = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module or "torch.optim"), attribute, None)
    except ImportError:
        found = None
    if not (isinstance(found, type) and issubclass(found, Optimizer)):
        raise ConfigError(
            f"model.init_args.optimizer={name} is not an optimizer class: give a torch.optim class "
            "(AdamW, SGD, Adam, RMSprop, ...) or the dotted path of one"
        )
    parameters = inspect.signature(found).parameters
    for key in ("lr", "weight_decay"):
        if key in arguments:
            raise ConfigError(f"model.init_args.optimizer_args.{key}: set model.init_args.{key} instead")
    if weight_decay and "weight_decay" not in parameters:
        raise ConfigError(f"{found.__name__} has no weight decay; set model.init_args.weight_decay=0")
    accepted = [name for name in parameters if name not in ("params", "lr", "weight_decay")]
    unknown = sorted(arguments.keys() - set(accepted))
    if unknown:
        raise ConfigError(
            f"model.init_args.optimizer_args: {found.__name__} takes no {', '.join(unknown)}; "
            f"it takes {', '.join(accepted)}"
        )
    return found


def build_optimizer(
    optimizer: type[Optimizer],
    parameters: Iterable[Any],
    lr: float,
    weight_decay: float,
    arguments: dict[str, Any] | None = None,
) -> Optimizer:
    """``optimizer`` (from ``optimizer_class``) on ``parameters`` (tensors, or parameter groups)
    at ``lr``, with ``weight_decay`` where it takes one and its other ``arguments``."""
    given = dict(arguments or {}, lr=lr)
    if "weight_decay" in inspect.signature(optimizer).parameters:
        given["weight_decay"] = weight_decay
    return optimizer(parameters, **given)


SCHEDULES: dict[str, Callable[[float], float]] = {
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
    "linear": lambda progress: 1.0 - progress,
    "constant": lambda progress: 1.0,
}


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str = "cosine") -> float:
    """The learning-rate factor at ``step``: linear warm-up to 1, then ``SCHEDULES[schedule]`` of
    the fraction of the remaining steps done.

    A closed form of the step, unlike chained schedulers, so a run resumed with a longer
    ``max_epochs`` follows the schedule of its new length instead of restarting a cosine cycle.
    The warm-up takes at most half of the ``total_steps``: a warm-up longer than the run would
    never reach the peak rate nor decay from it.
    """
    warmup_steps = min(warmup_steps, total_steps // 2)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return SCHEDULES[schedule](progress)


def warmup_then_decay(optimizer: Optimizer, warmup_steps: int, schedule: str = "cosine") -> dict[str, Any]:
    """The ``lr_scheduler`` for ``configure_optimizers`` to return with ``optimizer``: each step's
    rate is its parameter groups' rate times ``lr_factor`` (``schedule``: ``cosine``, ``linear``
    or ``constant``) over the run's steps, which ``start_schedules`` gives it once training starts.
    """

    def factor(step: int) -> float:
        return lr_factor(step, warmup_steps, factor.total_steps, schedule)

    # A plain function, which LambdaLR leaves out of checkpoints: the run's length and settings
    # come from the run resumed, not from the one saved.
    factor.total_steps = 1
    return {"scheduler": LambdaLR(optimizer, factor), "interval": "step"}


def start_schedules(trainer: Trainer) -> None:
    """Give the schedules of ``warmup_then_decay`` the run's number of optimizer steps, and set
    each parameter group's rate to its schedule's at the current step; in ``on_train_start``.

    The run's length is read there rather than in ``configure_optimizers``: asking for it builds
    the training loader, which must happen after a resumed run has restored its loops, or the
    loader's mid-epoch position is lost. A resumed run restores the rate its checkpoint ended on;
    this run's schedule gives the current step's, which differs when ``max_epochs`` has changed.
    """
    total_steps = trainer.estimated_stepping_batches
    if not math.isfinite(total_steps):
        raise ConfigError(
            "The learning-rate schedule needs a finite run: set trainer.max_epochs or max_steps"
        )
    for config in trainer.lr_scheduler_configs:
        scheduler = config.scheduler
        factors = getattr(scheduler, "lr_lambdas", [])
        if not all(hasattr(factor, "total_steps") for factor in factors):
            continue  # a schedule of another kind
        for group, base_lr, factor in zip(
            scheduler.optimizer.param_groups, scheduler.base_lrs, factors, strict=True
        ):
            factor.total_steps = total_steps
            group["lr"] = base_lr * factor(scheduler.last_epoch)


def classification_metrics(num_classes: int) -> MetricCollection:
    """Accuracy (``acc``) and macro-F1 (``f1``) of predicted class indices; ``clone`` it with a
    prefix (``val/``) for each split."""
    # The inputs come from the network itself, so the metrics skip validating them, which would
    # wait for the device.
    return MetricCollection(
        {
            "acc": MulticlassAccuracy(num_classes, average="micro", validate_args=False),
            "f1": MulticlassF1Score(num_classes, average="macro", validate_args=False),
        }
    )


def regression_metrics() -> MetricCollection:
    """Mean absolute error (``mae``), root mean squared error (``rmse``) and ``r2`` of predictions in
    the target's units; ``clone`` it with a prefix (``val/``) for each split."""
    return MetricCollection(
        {"mae": MeanAbsoluteError(), "rmse": MeanSquaredError(squared=False), "r2": R2Score()}
    )


def logs_this_step(module: LightningModule) -> bool:
    """Whether the loggers write the values of the current optimizer step: the steps on which
    reading a value from the device costs nothing more, as the loggers read it anyway."""
    every = module.trainer.log_every_n_steps
    return every > 0 and (module.global_step + 1) % every == 0


def check_finite(loss: Tensor, module: LightningModule, batch_idx: int) -> None:
    """Stop the run, saying where, on a loss that is NaN or infinite. No checkpoint is ever saved
    with non-finite weights (AtomicCheckpointIO checks every save), so the last ones stay good.

    It waits for the device to read the loss: call it on the steps of ``logs_this_step``.
    """
    if not torch.isfinite(loss):
        raise FloatingPointError(
            f"train/loss is {loss.item()} at step {module.global_step} (epoch {module.current_epoch}, "
            f"batch {batch_idx}); stopping, with the checkpoints as they were. Lower "
            "model.init_args.lr, or set trainer.detect_anomaly=true to find the operation at fault"
        )


def take_preprocessing(preprocess: Preprocessing, data: Any) -> None:
    """Make ``preprocess`` (the module's own, its first layer) the one the data module ``data``
    fitted on the training split, if it has one; in the module's ``setup``. Save its
    ``describe()`` in ``on_save_checkpoint`` and ``restore`` it in ``on_load_checkpoint``, and the
    module carries it: a checkpoint being resumed or evaluated then restores its own."""
    fitted = getattr(data, "preprocessing", None)
    if isinstance(fitted, Preprocessing):
        preprocess.load_state_dict(fitted.state_dict())
        preprocess.restore(fitted.describe())
