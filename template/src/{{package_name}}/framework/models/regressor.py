"""The LightningModule that trains a regression network: MSE or Huber loss, MAE, RMSE and R²."""

from typing import Literal

from jsonargparse.typing import PositiveFloat
from torch import Tensor, nn
from torch.nn import functional

from .base import SupervisedModule
from .parts import regression_metrics


class Regressor(SupervisedModule):
    """Regression of one numeric target. The network learns the target standardised on the
    training split; the model's outputs, its metrics and its predictions are in the target's own
    units.

    Args:
        network: the ``nn.Module`` mapping a batch of inputs to one output per sample.
        loss: ``mse`` (mean squared error) or ``huber``, less swayed by outliers.
        huber_delta: where the Huber loss turns from quadratic to linear, in standardised units.
        **kwargs: optimizer and schedule, see ``SupervisedModule``.
    """

    task = "regression"

    def __init__(
        self,
        network: nn.Module,
        loss: Literal["mse", "huber"] = "mse",
        huber_delta: PositiveFloat = 1.0,
        **kwargs,
    ) -> None:
        super().__init__(network, **kwargs)
        self.init_metrics(regression_metrics())

    def forward(self, x: Tensor) -> Tensor:
        """Predictions in the target's units."""
        return self.preprocess.unscale_targets(self.network(self.preprocess(x)).squeeze(-1))

    def objective(self, outputs: Tensor, targets: Tensor) -> Tensor:
        # On the standardised scale, where the loss's size does not depend on the target's units.
        scaled, target = self.preprocess.scale_targets(outputs), self.preprocess.scale_targets(targets)
        if self.hparams.loss == "huber":
            return functional.huber_loss(scaled, target, delta=self.hparams.huber_delta, reduction="none")
        return functional.mse_loss(scaled, target, reduction="none")

    def evaluation_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return self.objective(outputs, targets)

    def metric_inputs(self, outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        return outputs.float(), targets.float()

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        return self(batch[0])
