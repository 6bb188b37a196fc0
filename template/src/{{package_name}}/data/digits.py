"""scikit-learn's bundled handwritten digits: 1,797 real 8x8 grey images of 0-9, no download."""

import numpy as np
from sklearn.datasets import load_digits

from .base import ArrayDataModule


class DigitsDataModule(ArrayDataModule):
    """Digits as 64 features scaled to [0, 1], ten classes."""

    def load_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        digits = load_digits()
        return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)
