"""Callbacks and helpers shared by every run: checkpoints, timing, record, predictions."""

from .checkpointing import AtomicCheckpointIO, LastCheckpoint, load_weights, read_checkpoint
from .predictions import PredictionWriter
from .record import ExperimentRecord
from .timing import StageTimer

__all__ = [
    "AtomicCheckpointIO",
    "ExperimentRecord",
    "LastCheckpoint",
    "PredictionWriter",
    "StageTimer",
    "load_weights",
    "read_checkpoint",
]
