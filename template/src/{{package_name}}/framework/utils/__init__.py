"""The callbacks and loggers a run's Trainer gets besides its checkpoints and record: timing, the
progress bar, predictions, test reports, out-of-memory triage, monitored metric names, wandb."""

from .memory import OutOfMemoryReport, is_out_of_memory
from .monitor import MonitorCheck
from .predictions import PredictionWriter
from .progress import ProgressBar
from .reports import TestReport
from .timing import StageTimer
from .tracking import WandbLogger

__all__ = [
    "MonitorCheck",
    "OutOfMemoryReport",
    "PredictionWriter",
    "ProgressBar",
    "StageTimer",
    "TestReport",
    "WandbLogger",
    "is_out_of_memory",
]
