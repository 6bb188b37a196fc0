"""The template's LightningModules: the supervised base, the Classifier, the Regressor and the
pretrained backbone's network; and the parts they are built from (``parts.py``), for yours too."""

from .base import SupervisedModule
from .classifier import Classifier
from .regressor import Regressor

__all__ = ["Classifier", "Regressor", "SupervisedModule"]
