"""Callbacks and helpers shared by every run: checkpoints, timing, record, predictions, reports,
out-of-memory triage, monitored metric names, interrupts, and the wandb logger."""

from .checkpointing import AtomicCheckpointIO, LastCheckpoint, load_weights, read_checkpoint
from .interrupts import end_with_parent, received_signal
from .memory import OutOfMemoryReport, is_out_of_memory
from .monitor import MonitorCheck
from .predictions import PredictionWriter
from .progress import ProgressBar
from .record import ExperimentRecord
from .reports import TestReport
from .timing import StageTimer
from .tracking import WandbLogger

__all__ = [
    "AtomicCheckpointIO",
    "ExperimentRecord",
    "LastCheckpoint",
    "MonitorCheck",
    "OutOfMemoryReport",
    "PredictionWriter",
    "ProgressBar",
    "StageTimer",
    "TestReport",
    "WandbLogger",
    "end_with_parent",
    "is_out_of_memory",
    "load_weights",
    "read_checkpoint",
    "received_signal",
]
