"""Networks (plain ``nn.Module``, one family per file) and the LightningModule that trains them."""

from .classifier import Classifier
from .mlp import MLP

__all__ = ["MLP", "Classifier"]
