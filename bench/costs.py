"""What each part of a generated project's ``fit`` costs: timers around the hooks and calls that
run at every step and at every epoch's end.

Run in a generated project's directory (``bench/run.py --keep DIR`` leaves one in
``DIR/bench_proj``), with the arguments of ``fit``:

    OMP_NUM_THREADS=1 PYTHONPATH=src python /path/to/bench/costs.py --package bench_proj \\
        fit --run_name costs

Prints, for each timed function, its total time over the run, its calls and the time per call.
Times nest: a hook's time includes the ``self.log`` and checkpoint calls made inside it.
"""

import argparse
import collections
import functools
import importlib
import time

from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loops import fit_loop, training_epoch_loop

totals: dict[str, float] = collections.defaultdict(float)
calls: collections.Counter = collections.Counter()


def timed(owner, name: str, label: str) -> None:
    function = getattr(owner, name)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - started
            calls[label] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--package", required=True)
    parser.add_argument("cli_args", nargs=argparse.REMAINDER, help="the arguments of the project's CLI")
    args = parser.parse_args()
    checkpointing = importlib.import_module(f"{args.package}.framework.runs.checkpoints")
    timing = importlib.import_module(f"{args.package}.framework.utils.timing")
    tracking = importlib.import_module(f"{args.package}.framework.utils.tracking")
    classifier = importlib.import_module(f"{args.package}.framework.models.classifier").Classifier

    timed(training_epoch_loop._TrainingEpochLoop, "advance", "a training step (loop advance)")
    timed(fit_loop._FitLoop, "on_advance_end", "an epoch's end (fit loop on_advance_end)")
    timed(LightningModule, "log", "LightningModule.log")
    timed(classifier, "training_step", "Classifier.training_step")
    timed(classifier, "on_before_optimizer_step", "Classifier.on_before_optimizer_step")
    timed(classifier, "on_train_epoch_end", "Classifier.on_train_epoch_end")
    timed(classifier, "on_validation_epoch_end", "Classifier.on_validation_epoch_end")
    timed(checkpointing.LastCheckpoint, "_save", "LastCheckpoint: saving last.ckpt")
    timed(checkpointing.AtomicCheckpointIO, "save_checkpoint", "AtomicCheckpointIO: write, fsync, rename")
    timed(ModelCheckpoint, "on_train_epoch_end", "ModelCheckpoint.on_train_epoch_end")
    timed(timing.StageTimer, "on_train_epoch_end", "StageTimer.on_train_epoch_end")
    timed(TQDMProgressBar, "on_train_batch_end", "progress bar: on_train_batch_end")
    timed(TQDMProgressBar, "on_train_epoch_start", "progress bar: on_train_epoch_start")
    timed(TQDMProgressBar, "on_train_epoch_end", "progress bar: on_train_epoch_end")
    timed(tracking.WandbLogger, "log_metrics", "WandbLogger.log_metrics (a line to its process)")
    timed(CSVLogger, "log_metrics", "CSVLogger.log_metrics (kept in memory)")
    timed(CSVLogger, "save", "CSVLogger.save (writes metrics.csv)")

    importlib.import_module(f"{args.package}.framework.cli").main(args.cli_args)
    print(f"\n{'total ms':>10s} {'calls':>6s} {'ms/call':>8s}  function")
    for label in sorted(totals, key=totals.get, reverse=True):
        total = 1000 * totals[label]
        print(f"{total:10.1f} {calls[label]:6d} {total / calls[label]:8.3f}  {label}")


if __name__ == "__main__":
    main()
