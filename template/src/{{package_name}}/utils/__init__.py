"""Callbacks shared by every run: timing, the experiment record and the prediction writer."""

from .predictions import PredictionWriter
from .record import ExperimentRecord
from .timing import StageTimer

__all__ = ["ExperimentRecord", "PredictionWriter", "StageTimer"]
