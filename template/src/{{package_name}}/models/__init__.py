"""Networks (plain ``nn.Module``, one family per file) and the LightningModules that train them."""

from .base import SupervisedModule
from .classifier import Classifier
from .mlp import MLP
from .regressor import Regressor

__all__ = ["MLP", "Classifier", "Regressor", "SupervisedModule"]
