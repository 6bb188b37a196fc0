"""Callbacks and helpers shared by every run: checkpoints, timing, record, predictions, reports."""

from .checkpointing import AtomicCheckpointIO, LastCheckpoint, load_weights, read_checkpoint
from .predictions import PredictionWriter
from .record import ExperimentRecord
from .reports import TestReport
from .timing import StageTimer

__all__ = [
    "AtomicCheckpointIO",
    "ExperimentRecord",
    "LastCheckpoint",
    "PredictionWriter",
    "StageTimer",
    "TestReport",
    "load_weights",
    "read_checkpoint",
]
