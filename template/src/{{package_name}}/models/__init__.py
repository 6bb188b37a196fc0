"""Networks (plain ``nn.Module``, one family per file) and the LightningModules that train them."""

from .base import SupervisedModule
from .classifier import Classifier
from .cnn import CNN
from .mlp import MLP
from .regressor import Regressor

__all__ = ["CNN", "MLP", "Classifier", "Regressor", "SupervisedModule"]
