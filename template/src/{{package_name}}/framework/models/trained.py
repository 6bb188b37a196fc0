"""A trained model of this project from its checkpoint, for ``scripts/export.py`` and ``serve``:
refused with one line when it is not a Classifier or Regressor of this project."""

import importlib
import sys
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule

from ..runs.checkpoints import check_made_here, read_checkpoint
from .base import SupervisedModule


def check_project_model(checkpoint: dict[str, Any]) -> None:
    """Refuse the checkpoint of a module of your own (any LightningModule) where a Classifier or a
    Regressor of this project is needed: export.py and serve use the preprocessing those carry and
    know what their outputs are. Only a class of this project, or one already imported, is looked
    at: nothing else that a checkpoint names is imported (Lightning refuses to build it anyway)."""
    class_path = (checkpoint.get("hyper_parameters") or {}).get("_class_path")
    if not isinstance(class_path, str):
        return
    module_name, _, name = class_path.rpartition(".")
    if module_name.partition(".")[0] == __name__.partition(".")[0]:
        try:
            importlib.import_module(module_name)
        except ImportError as error:  # a module of this project renamed, or broken, since
            raise ValueError(f"{class_path} cannot be imported: {error}") from None
    found = getattr(sys.modules.get(module_name), name, None)
    if not (isinstance(found, type) and issubclass(found, SupervisedModule)):
        raise ValueError(
            f"{class_path} is not a Classifier or Regressor of this project: export.py and serve take "
            "those alone (they need the preprocessing those keep); export your own module with "
            "torch.onnx.export, or serve it with LitServe"
        )


def load_trained(path: str | Path) -> tuple[LightningModule, LightningDataModule]:
    """A checkpoint's model, in eval mode on the CPU, and its data module, built from the settings
    it was trained with (no data is read until its ``setup``)."""
    checkpoint = read_checkpoint(path)
    if "pytorch-lightning_version" not in checkpoint:
        raise ValueError(f"{path} is not a Lightning checkpoint; a state_dict lacks the model config")
    check_made_here(checkpoint, path)
    check_project_model(checkpoint)
    package = __name__.partition(".")[0]
    for hyper_parameters in ("hyper_parameters", "datamodule_hyper_parameters"):
        class_path = checkpoint.get(hyper_parameters, {}).get("_class_path", "")
        if class_path.startswith(f"{package}."):
            # Lightning builds only classes already imported: import the project's own module.
            importlib.import_module(class_path.rpartition(".")[0])
    with warnings.catch_warnings():
        # The model is rebuilt with the network built from its saved config; Lightning's advice to
        # leave a module out of the hyper-parameters is for a model built by hand.
        warnings.filterwarnings("ignore", message="Attribute 'network' is an instance of `nn.Module`")
        model = LightningModule.load_from_checkpoint(path, map_location="cpu").eval()
    return model, LightningDataModule.load_from_checkpoint(path)
