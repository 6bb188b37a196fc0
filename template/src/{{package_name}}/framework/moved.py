"""The template's modules under the paths they had before v0.17.0 moved them into ``framework/``.

Checkpoints, configs and your own modules written before then name the old paths: a checkpoint
keeps its model's class path (``<package>.models.classifier.Classifier``), and a data module of
yours may import ``from .base import ArrayDataModule``. Importing an old path gives the module at its
new home, the same module object, so that such a checkpoint still loads, tests and predicts.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

# Moved whole: these modules and packages, with everything in them.
WHOLE = ("cli", "settings", "errors", "serving", "testing", "runs", "sweeps", "utils")
# Moved one by one, out of the folders that keep your models and data modules.
SINGLE = (
    "models.base",
    "models.classifier",
    "models.regressor",
    "models.backbone",
    "data.base",
    "data.contract",
    "data.file",
    "data.images",
    "data.preprocessing",
    "data.splits",
    "data.streaming",
    "data.tables",
)


def new_name(name: str, package: str) -> str | None:
    """Where the module ``name`` lives now, if it is one of the package's moved modules."""
    top, _, rest = name.partition(".")
    if top != package or not (rest.partition(".")[0] in WHOLE or rest in SINGLE):
        return None
    return f"{package}.framework.{rest}"


class OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of the package's modules and loads it as the module at its new path."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        new = new_name(name, self.package)
        return None if new is None else importlib.util.spec_from_loader(name, self, origin=new)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return importlib.import_module(spec.origin)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: ``create_module`` gave the module, imported at its new path."""


def install(package: str) -> None:
    """Let the old paths of ``package``'s modules import (once per process)."""
    if not any(isinstance(finder, OldPaths) and finder.package == package for finder in sys.meta_path):
        sys.meta_path.insert(0, OldPaths(package))
