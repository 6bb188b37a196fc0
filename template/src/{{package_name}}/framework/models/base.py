"""What every task's LightningModule shares: preprocessing, optimizer, schedule and logging.

``Classifier`` and ``Regressor`` add their loss, metrics and predictions. The network itself is
any ``nn.Module`` chosen in config (``model.init_args.network``), so a new architecture is a new
file in ``models/`` and a config change, not an edit here.
"""

import importlib
import inspect
import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import grad_norm
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MeanMetric, MetricCollection

from ..data.preprocessing import Preprocessing
from ..errors import ConfigError


class SupervisedModule(LightningModule):
    """Training with a ``torch.optim`` optimizer (AdamW by default), linear warm-up then a decay
    schedule (cosine by default), on the preprocessed inputs.

    A subclass sets ``metrics`` (a ``MetricCollection``) and implements ``objective`` (the
    per-sample training loss), ``evaluation_loss`` (the per-sample loss reported on val and test),
    ``metric_inputs`` (what the metrics compare) and ``predict_step``; it sets ``task``, and a
    classifier gives its ``class_names``, which the callbacks read.

    What it reads of the data module (``trainer.datamodule``) is written down in
    ``framework/data/contract.py``: its ``task``, ``batch_size`` and fitted ``preprocessing``.

    The constrained types (``PositiveFloat`` and the like) make the CLI refuse an impossible value
    at start-up, naming its key.

    Args:
        network: the ``nn.Module`` mapping a batch of preprocessed inputs to outputs.
        lr: peak learning rate, reached after warm-up. With ``scale_lr`` it is the rate for
            ``base_batch_size`` and grows linearly with the effective batch size.
        weight_decay: the optimizer's weight decay (decoupled for AdamW).
        optimizer: the optimizer: a class of ``torch.optim`` by name (``AdamW``, ``SGD``, ...) or
            any optimizer class by its dotted path.
        optimizer_args: the optimizer's other arguments, e.g. ``{momentum: 0.9, nesterov: true}``
            for SGD; ``lr`` and ``weight_decay`` are set above, once.
        warmup_steps: optimizer steps of linear warm-up to ``lr``; at most half the run's steps,
            so that a short run (a smoke run, a tiny subset) still reaches ``lr`` and decays.
        schedule: the learning rate after warm-up, until the run's last step: ``cosine`` decay to
            0, ``linear`` decay to 0, or ``constant``.
        scale_lr: apply the linear scaling rule to ``lr``.
        base_batch_size: the effective batch size at which ``lr`` applies unscaled.
        compile: compile the network with ``torch.compile`` before training. The first steps
            take longer while it compiles; the later ones run faster where the network's
            operations are worth fusing.
        freeze_epochs: for a network with a pretrained backbone and a new ``head``
            (``models.backbone.Backbone``): train the head alone for this many epochs, the
            backbone's weights and batch-norm statistics frozen, then everything.
        backbone_lr_scale: for such a network, the backbone's learning rate as a fraction of the
            head's (``lr``), through warm-up, schedule and ``scale_lr`` alike.
    """

    task: str  # what the data's labels are: "classification" or "regression"

    def __init__(
        self,
        network: nn.Module,
        lr: PositiveFloat = 3e-3,
        weight_decay: NonNegativeFloat = 0.01,
        optimizer: str = "AdamW",
        optimizer_args: dict[str, Any] | None = None,
        warmup_steps: NonNegativeInt = 50,
        schedule: Literal["cosine", "linear", "constant"] = "cosine",
        scale_lr: bool = False,
        base_batch_size: PositiveInt = 64,
        compile: bool = False,
        freeze_epochs: NonNegativeInt = 0,
        backbone_lr_scale: PositiveFloat = 1.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()  # with the subclass's arguments
        for key, value in {"lr": lr, "weight_decay": weight_decay}.items():
            if not math.isfinite(value):
                raise ConfigError(f"model.init_args.{key} must be a finite number, got {value}")
        has_head = isinstance(getattr(network, "head", None), nn.Module)
        if (freeze_epochs or backbone_lr_scale != 1) and not has_head:
            raise ConfigError(
                "model.init_args.freeze_epochs and backbone_lr_scale need a network with a pretrained "
                f"backbone and a head (models.backbone.Backbone); {type(network).__name__} has no head"
            )
        self.optimizer_class = optimizer_class(optimizer, optimizer_args or {}, weight_decay)
        self.preprocess = Preprocessing()  # fitted by the data module on the training split
        self.network = network
        self.train_loss = MeanMetric(nan_strategy="disable")
        self.val_loss = MeanMetric(nan_strategy="disable")
        self.test_loss = MeanMetric(nan_strategy="disable")
        self.train_outputs: list[tuple[Tensor, Tensor, Tensor]] = []  # not yet in the metrics
        self.total_steps = 1  # the run's optimizer steps, known once training starts

    def init_metrics(self, metrics: MetricCollection) -> None:
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")

    def forward(self, x: Tensor) -> Tensor:
        return self.network(self.preprocess(x))

    def objective(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """The per-sample training loss."""
        raise NotImplementedError

    def evaluation_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """The per-sample loss reported on the validation and test splits."""
        raise NotImplementedError

    def metric_inputs(self, outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """What the metrics compare: predictions and targets, from the network's outputs."""
        raise NotImplementedError

    def configure_model(self) -> None:
        if self.hparams.compile:
            self.network.compile()  # in place, so the weights keep their names in checkpoints

    def setup(self, stage: str) -> None:
        data = self.trainer.datamodule
        check_task(type(self), getattr(data, "task", self.task))
        if getattr(self.network, "channels_last", False) and self.trainer.strategy.root_device.type == "cuda":
            self.network.to(memory_format=torch.channels_last)
        fitted = getattr(data, "preprocessing", None)
        if isinstance(fitted, Preprocessing):
            # A checkpoint being resumed or evaluated then restores its own, saved with it.
            self.preprocess.load_state_dict(fitted.state_dict())
            self.preprocess.restore(fitted.describe())

    def on_train_epoch_start(self) -> None:
        self._freeze_for_epoch()

    def _freeze_for_epoch(self) -> None:
        # Also at on_train_start: Lightning skips on_train_epoch_start for an epoch resumed mid-way.
        if self.hparams.freeze_epochs:
            self.network.freeze(self.current_epoch < self.hparams.freeze_epochs)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["preprocessing"] = self.preprocess.describe()
        # The checkpoint holds every weight: a model rebuilt from it (test, predict, serve, export)
        # starts from those, not from the network's starting weights, a file or a download.
        network = checkpoint.get("hyper_parameters", {}).get("network")
        if isinstance(network, dict) and network.get("init_args", {}).get("weights"):
            starting_from_none = {**network["init_args"], "weights": None}
            checkpoint["hyper_parameters"]["network"] = {**network, "init_args": starting_from_none}

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        outputs = self(x)
        loss = self.objective(outputs, y).mean()
        # Collected, and added to the epoch's metrics in one update on the steps the loggers
        # write, rather than updating them after every step.
        self.train_outputs.append((*self.metric_inputs(outputs.detach(), y), loss.detach()))
        # Logged, and checked, only on the steps the loggers write: those read the value anyway,
        # so no other step waits for the device or pays for logging. No checkpoint is ever saved
        # with non-finite weights (AtomicCheckpointIO checks every save).
        if self._logs_this_step():
            self._update_train_metrics()
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"train/loss is {loss.item()} at step {self.global_step} (epoch {self.current_epoch}, "
                    f"batch {batch_idx}); stopping, with the checkpoints as they were. Lower "
                    "model.init_args.lr, or set trainer.detect_anomaly=true to find the operation at fault"
                )
            self.log("train/loss", loss, prog_bar=True)
        return loss

    def _update_train_metrics(self) -> None:
        if self.train_outputs:
            predictions, targets, losses = zip(*self.train_outputs, strict=True)
            self.train_metrics.update(torch.cat(predictions), torch.cat(targets))
            self.train_loss.update(torch.stack(losses))
            self.train_outputs.clear()

    def _logs_this_step(self) -> bool:
        """Whether the loggers write the values of the current optimizer step."""
        every = self.trainer.log_every_n_steps
        return every > 0 and (self.global_step + 1) % every == 0

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics, self.val_loss)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        # The outputs go on to the callbacks: TestReport builds its report from them.
        return self._evaluate(batch, self.test_metrics, self.test_loss)

    def _evaluate(self, batch: tuple[Tensor, Tensor], metrics: MetricCollection, loss: MeanMetric) -> Tensor:
        # Accumulated in metrics and logged once, at the epoch's end, rather than by a self.log
        # call per batch. The mean is over samples, whatever the batches' sizes.
        x, y = batch
        outputs = self(x)
        loss.update(self.evaluation_loss(outputs, y))
        metrics.update(*self.metric_inputs(outputs, y))
        return outputs

    # Metrics are computed once per epoch from their state accumulated over all processes, then
    # reset; the epoch's mean loss too, so no step pays for a synchronisation between processes.
    def on_train_epoch_end(self) -> None:
        self._update_train_metrics()
        self.log("train/loss_epoch", self.train_loss.compute(), sync_dist=True)
        self.train_loss.reset()
        self._log_epoch_metrics(self.train_metrics)

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_metrics(self.val_metrics, self.val_loss)

    def on_test_epoch_end(self) -> None:
        self._log_epoch_metrics(self.test_metrics, self.test_loss)

    def _log_epoch_metrics(self, metrics: MetricCollection, loss: MeanMetric | None = None) -> None:
        values = metrics.compute()
        if loss is not None:
            values[f"{metrics.prefix}loss"] = loss.compute()
            loss.reset()
        self.log_dict(values, prog_bar=True, sync_dist=True)
        metrics.reset()

    def on_before_optimizer_step(self, optimizer) -> None:
        # The norm before clipping, and the learning rate this step uses, on the steps the loggers
        # write (logged with the other values, which costs a logger such as wandb one call, not two).
        if self._logs_this_step():
            self.log("train/grad_norm", grad_norm(self, norm_type=2)["grad_2.0_norm_total"])
            self.log("train/lr", optimizer.param_groups[0]["lr"])
            if len(optimizer.param_groups) > 1:
                self.log("train/lr_backbone", optimizer.param_groups[1]["lr"])

    def on_train_start(self) -> None:
        # The schedule's length is read here rather than in configure_optimizers: asking for it
        # builds the training loader, which must happen after a resumed run has restored its
        # loops, or the loader's mid-epoch position is lost.
        self.total_steps = self.trainer.estimated_stepping_batches
        self._freeze_for_epoch()
        for logger in self.loggers:
            logger.log_hyperparams({"effective_batch_size": self.effective_batch_size})
        if not math.isfinite(self.total_steps):
            raise ConfigError(
                "The learning-rate schedule needs a finite run: set trainer.max_epochs or max_steps"
            )
        # A resumed run restores the rate its checkpoint ended on; take the current step's rate
        # from this run's schedule instead, which differs when max_epochs has changed.
        for config in self.trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            for group, base_lr, factor in zip(
                scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
            ):
                group["lr"] = base_lr * factor(scheduler.last_epoch)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # Checkpoints of v0.2.0 and earlier have no preprocessing: they were trained on the
        # features as loaded, which an unfitted Preprocessing passes through.
        unfitted = Preprocessing()
        self.preprocess.restore(checkpoint.get("preprocessing", unfitted.describe()))
        state = checkpoint.get("state_dict", {})
        for key, value in unfitted.state_dict().items():
            state.setdefault(f"preprocess.{key}", value)
        # Checkpoints of v0.1.0 hold a SequentialLR (LinearLR, then CosineAnnealingLR). The
        # LambdaLR that replaced it computes the rate from the step alone, which both keep as
        # last_epoch, so only the chained schedulers' own entries go.
        for state in checkpoint.get("lr_schedulers", []):
            if "_schedulers" in state and "lr_lambdas" not in state:
                del state["_schedulers"], state["_milestones"]
                state["lr_lambdas"] = [None] * len(state["_last_lr"])

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step: batch size x gradient accumulation x number of processes."""
        batch_size = self.trainer.datamodule.batch_size
        return batch_size * self.trainer.accumulate_grad_batches * self.trainer.world_size

    def configure_optimizers(self):
        lr = self.hparams.lr
        if self.hparams.scale_lr:
            lr *= self.effective_batch_size / self.hparams.base_batch_size
        arguments = dict(self.hparams.optimizer_args or {}, lr=lr)
        if "weight_decay" in inspect.signature(self.optimizer_class).parameters:
            arguments["weight_decay"] = self.hparams.weight_decay
        optimizer = self.optimizer_class(self.parameter_groups(lr), **arguments)
        scheduler = LambdaLR(optimizer, self.lr_factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def parameter_groups(self, lr: float) -> list[dict[str, Any]]:
        """One group of every parameter; for a network with a ``head``, two: the head's at ``lr``,
        then the backbone's at ``lr`` x ``backbone_lr_scale``."""
        head = getattr(self.network, "head", None)
        if not isinstance(head, nn.Module):
            return [{"params": list(self.parameters())}]
        in_head = {id(parameter) for parameter in head.parameters()}
        backbone = [parameter for parameter in self.parameters() if id(parameter) not in in_head]
        return [
            {"params": list(head.parameters()), "lr": lr},
            {"params": backbone, "lr": lr * self.hparams.backbone_lr_scale},
        ]

    def lr_factor(self, step: int) -> float:
        """The schedule: warm-up, then the chosen shape over the run's ``total_steps``."""
        return lr_factor(step, self.hparams.warmup_steps, self.total_steps, self.hparams.schedule)


def check_task(model_class: type, task: str) -> None:
    """Refuse data whose labels are of another task than the model's, saying how to switch."""
    if getattr(model_class, "task", task) != task:
        model, other = {"regression": ("Regressor", "classification")}.get(task, ("Classifier", "regression"))
        raise ConfigError(
            f"the data's task is {task} (data.init_args.task) but the model is a {model_class.__name__}: "
            f"add --config configs/model/{model.lower()}.yaml to train a {model}, or set "
            f"data.init_args.task={other}"
        )


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
