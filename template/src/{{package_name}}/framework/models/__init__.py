"""The template's LightningModules: the supervised base, the Classifier, the Regressor and the
pretrained backbone's network."""

from .base import SupervisedModule
from .classifier import Classifier
from .regressor import Regressor

__all__ = ["Classifier", "Regressor", "SupervisedModule"]
