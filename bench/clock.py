"""A callback that times a Lightning run from inside its process, for the benchmark.

It writes, as JSON: the wall-clock time of the first optimizer step (to measure start-up from
the process start), the whole fit's time (from the callbacks' ``setup`` to their ``teardown``:
sanity check, every epoch with its validation, checkpoints and loggers), the steady-state
training time from the end of the first optimizer step to the end of the last one with
validation subtracted, split into the intervals between two steps of an epoch and the
boundaries between epochs (end of one epoch's last step to the end of the next one's first,
validation subtracted), the time of every validation epoch, the step count and the process's
peak RSS. With ``BENCH_INIT`` set it also saves the network's initial weights there, for the
hand loop. Under DDP only the first process writes; the others train in step with it.
"""

import json
import os
import resource
import time

import torch
from lightning.pytorch import Callback


class BenchClock(Callback):
    def __init__(self, out: str) -> None:
        self.out = out
        self.first_step_wall: float | None = None
        self.first_step: float | None = None
        self.last_step = 0.0
        self.val_started = 0.0
        self.val_times: list[float] = []
        self.val_in_span = 0.0
        self.val_pending = 0.0
        self.intervals: list[float] = []
        self.boundaries: list[float] = []
        self.steps = 0
        self.fit_started = 0.0

    def setup(self, trainer, pl_module, stage) -> None:
        self.fit_started = time.perf_counter()

    def on_fit_start(self, trainer, pl_module) -> None:
        init = os.environ.get("BENCH_INIT")
        if init and trainer.is_global_zero and not os.path.exists(init):
            torch.save(pl_module.network.state_dict(), init)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self.first_step is None:
            self.first_step_wall, self.first_step = time.time(), now
        elif batch_idx == 0:
            self.boundaries.append(now - self.last_step - self.val_pending)
        else:
            self.intervals.append(now - self.last_step)
        self.val_pending = 0.0
        self.last_step = now
        self.steps = trainer.global_step

    def on_validation_start(self, trainer, pl_module) -> None:
        self.val_started = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        elapsed = time.perf_counter() - self.val_started
        self.val_times.append(elapsed)
        if self.first_step is not None:
            self.val_in_span += elapsed
            self.val_pending += elapsed

    def teardown(self, trainer, pl_module, stage) -> None:
        # After every callback's on_fit_end (the record, the loggers' last writes).
        if not trainer.is_global_zero:
            return
        fit_s = time.perf_counter() - self.fit_started
        # Validation after the last step is outside the span; only the validation between steps counts.
        final_val = self.val_times[-1] if self.val_times and self.val_started > self.last_step else 0.0
        result = {
            "first_step_wall": self.first_step_wall,
            "lightning_imported_wall": float(os.environ.get("BENCH_LIGHTNING_IMPORTED", "nan")),
            "train_s": self.last_step - self.first_step - (self.val_in_span - final_val),
            "fit_s": fit_s,
            "steps": self.steps,
            "intervals_s": self.intervals,
            "boundaries_s": self.boundaries,
            "val_epoch_s": self.val_times,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "val_acc": float(trainer.callback_metrics.get("val/acc", float("nan"))),
        }
        with open(self.out, "w") as file:
            json.dump(result, file)
