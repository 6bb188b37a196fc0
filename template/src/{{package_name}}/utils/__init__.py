"""Callbacks shared by every run: last checkpoint, timing, experiment record, prediction writer."""

from .checkpointing import LastCheckpoint
from .predictions import PredictionWriter
from .record import ExperimentRecord
from .timing import StageTimer

__all__ = ["ExperimentRecord", "LastCheckpoint", "PredictionWriter", "StageTimer"]
