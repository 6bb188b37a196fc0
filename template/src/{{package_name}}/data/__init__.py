"""Data modules: splitting and loading apart from where the arrays come from."""

from .base import ArrayDataModule
from .digits import DigitsDataModule
from .file import FileDataModule

__all__ = ["ArrayDataModule", "DigitsDataModule", "FileDataModule"]
