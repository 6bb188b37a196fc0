"""The progress bar. On a terminal: Lightning's tqdm one, redrawn a few times a second however
short the batches. Anywhere else (output to a file, a Slurm job's log): plain lines, one at the
end of each epoch with its metrics and one every half minute within a long stage, instead of the
redraws, which a file keeps every one of."""

import contextlib
import sys
import time
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar
from tqdm import tqdm


class Lines:
    """What Lightning's progress bar calls of a tqdm bar, printing a line at most every
    ``every_s`` seconds of a stage rather than redrawing one; ``print_line`` prints one now."""

    def __init__(self, description: str, disable: bool, every_s: float) -> None:
        self.desc, self.disable, self.every_s = description, disable, every_s
        self.initial = 0
        self.postfix: dict = {}
        self.reset()

    def reset(self, total: int | None = None) -> None:
        self.n, self.total = 0, total
        self.started = time.monotonic()
        self.next_line = self.started + self.every_s

    def set_description(self, description: str) -> None:
        self.desc = description

    def set_postfix(self, metrics: dict) -> None:
        self.postfix = metrics

    def refresh(self) -> None:
        # Lightning sets n and refreshes after a batch, a few times a second at most.
        now = time.monotonic()
        if now >= self.next_line:
            self.next_line = now + self.every_s
            self.print_line()

    def print_line(self) -> None:
        """The stage, its batches done and time so far, and the metrics shown: one line."""
        if self.disable:
            return
        total = "?" if self.total is None else self.total
        elapsed = tqdm.format_interval(time.monotonic() - self.started)
        metrics = ", ".join(f"{name}={_shown(value)}" for name, value in self.postfix.items())
        print(f"{self.desc}: {self.n}/{total} [{elapsed}] {metrics}".rstrip(), flush=True)

    def write(self, text: str, **_: object) -> None:
        print(text, flush=True)

    def close(self) -> None:
        """Nothing to end: every line printed ends with its line break."""


def _shown(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class ProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` that redraws at most ``per_second`` times a second, and after the last
    batch of each stage; or, where the output is no terminal, prints ``Lines``: one per epoch and
    at most one every ``line_every_s`` seconds within a stage.

    Lightning's bars redraw after every batch, which slows down a run of short batches.
    """

    def __init__(self, per_second: float = 4, line_every_s: float = 30) -> None:
        super().__init__()
        self.interval = 1 / per_second
        self._next_draw = 0.0
        # Read once, where the command starts: DDP's processes print to the same output.
        self.line_every_s = None if sys.stdout.isatty() else line_every_s
        self._epoch_ended = False  # and its line not printed yet

    def _lines(self, description: str) -> Lines | None:
        """A bar of plain lines where the output is no terminal; None on a terminal."""
        return Lines(description, self.is_disabled, self.line_every_s) if self.line_every_s else None

    def init_sanity_tqdm(self):
        return self._lines(self.sanity_check_description) or super().init_sanity_tqdm()

    def init_train_tqdm(self):
        return self._lines(self.train_description) or super().init_train_tqdm()

    def init_validation_tqdm(self):
        return self._lines(self.validation_description) or super().init_validation_tqdm()

    def init_test_tqdm(self):
        return self._lines(self.test_description) or super().init_test_tqdm()

    def init_predict_tqdm(self):
        return self._lines(self.predict_description) or super().init_predict_tqdm()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._draw(self.train_progress_bar, batch_idx + 1):
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_validation_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int, *_: int
    ) -> None:
        self._draw(self.val_progress_bar, batch_idx + 1)

    def on_test_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int, *_: int
    ) -> None:
        self._draw(self.test_progress_bar, batch_idx + 1)

    def on_predict_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int, *_: int
    ) -> None:
        self._draw(self.predict_progress_bar, batch_idx + 1)

    def _draw(self, bar: Any, done: int) -> bool:
        """Show ``done`` batches on ``bar`` if the last draw was long enough ago, or the stage has
        ended; whether it was time to."""
        # The total is unknown (None) in an epoch resumed part-way through.
        now = time.monotonic()
        last = bar.total is not None and done >= bar.total
        if not self.is_enabled or (not last and now < self._next_draw):
            return False
        self._next_draw = now + self.interval
        if not bar.disable:
            bar.n = done
            bar.refresh()
        return True

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        # Lightning shows the logger's version as v_num: for wandb, the end of a random run id.
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Reading the metrics at an epoch's end computes the values logged with sync_dist, a
        # collective operation every DDP process must join. Only rank 0 draws the bar, so every
        # process reads them here, in the same order, and rank 0 alone shows them.
        metrics = self.get_metrics(trainer, pl_module)
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(metrics)
        self._epoch_ended = True  # the bar stays, for the next epoch (leave=False)

    def on_train_epoch_start(self, trainer: Trainer, *_: object) -> None:
        self._print_ended_epoch(trainer)
        super().on_train_epoch_start(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._print_ended_epoch(trainer)
        super().on_train_end(trainer, pl_module)

    def _print_ended_epoch(self, trainer: Trainer) -> None:
        """The line of the epoch that ended, printed once the model has logged what it logs at an
        epoch's end, after this callback's ``on_train_epoch_end``. As there, every process reads
        the metrics, whatever it prints."""
        if not self._epoch_ended:
            return
        self._epoch_ended = False
        metrics = self.get_metrics(trainer, trainer.lightning_module)
        bar = self.train_progress_bar
        if isinstance(bar, Lines) and not bar.disable:
            bar.set_postfix(metrics)
            bar.print_line()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # A bar is drawn without a line break; the error line the command ends with starts on a
        # line of its own. The validation bar, drawn below the training bar, is cleared first.
        for stage in ("val", "test", "predict", "train"):
            with contextlib.suppress(TypeError):  # a bar not made in this run
                bar = getattr(self, f"{stage}_progress_bar")
                if not bar.disable:
                    bar.close()
