"""Your networks (plain ``nn.Module``, one family per file) and LightningModules, beside the
template's, which configs name by these short paths (``<package>.models.Classifier``)."""

from ..framework.models import Classifier, Regressor, SupervisedModule
from .mlp import MLP

__all__ = ["MLP", "Classifier", "Regressor", "SupervisedModule"]
