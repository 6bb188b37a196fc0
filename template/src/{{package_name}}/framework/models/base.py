"""What every task's LightningModule shares: preprocessing, optimizer, schedule and logging.

``Classifier`` and ``Regressor`` add their loss, metrics and predictions. The network itself is
any ``nn.Module`` chosen in config (``model.init_args.network``), so a new architecture is a new
file in ``models/`` and a config change, not an edit here.
"""

import math
from typing import Any, Literal

import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import grad_norm
from torch import Tensor, nn
from torchmetrics import MeanMetric, MetricCollection

from ..data.preprocessing import Preprocessing
from ..errors import ConfigError
from .parts import (
    build_optimizer,
    check_finite,
    logs_this_step,
    optimizer_class,
    start_schedules,
    take_preprocessing,
    warmup_then_decay,
)


class SupervisedModule(LightningModule):
    """Training with a ``torch.optim`` optimizer (AdamW by default), linear warm-up then a decay
    schedule (cosine by default), on the preprocessed inputs; built from the parts of ``parts.py``.

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
            (``models.backbone.Backbone``, ``models.text_pretrained.PretrainedTextEncoder``): train
            the head alone for this many epochs, the backbone's weights and batch-norm statistics
            frozen, then everything.
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
        take_preprocessing(self.preprocess, data)

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
        # A network that needs more than null weights to be built again (a pretrained text
        # encoder, its configuration) says what, in ``checkpoint_init_args``.
        if isinstance(network, dict) and network.get("init_args", {}).get("weights"):
            rebuilt = getattr(self.network, "checkpoint_init_args", lambda: {"weights": None})()
            starting_from_none = {**network["init_args"], **rebuilt}
            checkpoint["hyper_parameters"]["network"] = {**network, "init_args": starting_from_none}

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        outputs = self(x)
        loss = self.objective(outputs, y).mean()
        # Collected, and added to the epoch's metrics in one update on the steps the loggers
        # write, rather than updating them after every step.
        self.train_outputs.append((*self.metric_inputs(outputs.detach(), y), loss.detach()))
        # Logged, and checked, only on the steps the loggers write: those read the value anyway,
        # so no other step waits for the device or pays for logging.
        if logs_this_step(self):
            self._update_train_metrics()
            check_finite(loss, self, batch_idx)
            self.log("train/loss", loss, prog_bar=True)
        return loss

    def _update_train_metrics(self) -> None:
        if self.train_outputs:
            predictions, targets, losses = zip(*self.train_outputs, strict=True)
            self.train_metrics.update(torch.cat(predictions), torch.cat(targets))
            self.train_loss.update(torch.stack(losses))
            self.train_outputs.clear()

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
        if logs_this_step(self):
            self.log("train/grad_norm", grad_norm(self, norm_type=2)["grad_2.0_norm_total"])
            self.log("train/lr", optimizer.param_groups[0]["lr"])
            if len(optimizer.param_groups) > 1:
                self.log("train/lr_backbone", optimizer.param_groups[1]["lr"])

    def on_train_start(self) -> None:
        self._freeze_for_epoch()
        for logger in self.loggers:
            logger.log_hyperparams({"effective_batch_size": self.effective_batch_size})
        start_schedules(self.trainer)

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
        groups, weight_decay = self.parameter_groups(lr), self.hparams.weight_decay
        optimizer = build_optimizer(
            self.optimizer_class, groups, lr, weight_decay, self.hparams.optimizer_args
        )
        schedule = warmup_then_decay(optimizer, self.hparams.warmup_steps, self.hparams.schedule)
        return {"optimizer": optimizer, "lr_scheduler": schedule}

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


def check_task(model_class: type, task: str) -> None:
    """Refuse data whose labels are of another task than the model's, saying how to switch."""
    if getattr(model_class, "task", task) != task:
        model, other = {"regression": ("Regressor", "classification")}.get(task, ("Classifier", "regression"))
        raise ConfigError(
            f"the data's task is {task} (data.init_args.task) but the model is a {model_class.__name__}: "
            f"add --config configs/model/{model.lower()}.yaml to train a {model}, or set "
            f"data.init_args.task={other}"
        )
