"""The progress bar: Lightning's tqdm one, redrawn a few times a second however short the batches."""

import time

from lightning.pytorch.callbacks import TQDMProgressBar


class ProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` that redraws at most ``per_second`` times a second, and after the last
    batch of each stage.

    Lightning's bars redraw after every batch. With the default model at batch size 64, that made
    a training step 10-50% slower with Lightning's rich bar; this one costs no measurable time.
    """

    def __init__(self, per_second: float = 4) -> None:
        super().__init__()
        self.interval = 1 / per_second
        self._next_draw = 0.0

    def _should_update(self, current: int, total: int | float) -> bool:
        now = time.monotonic()
        if not self.is_enabled or (current < total and now < self._next_draw):
            return False
        self._next_draw = now + self.interval
        return True
