"""A network for images from timm (PyTorch Image Models), by name, starting from pretrained weights
or random ones, with a new head for the data's classes. Needs the ``images`` extra."""

import difflib
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from ..runs.checkpoints import read_checkpoint

KEY = "model.init_args.network.init_args"
# What may come before the network's own weight names in a file: a DDP wrapper's prefix, a
# checkpoint of this project's, and a module that held the network as ``model``'s.
PREFIXES = ("module.", "network.model.", "model.")
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def timm_module() -> Any:
    """timm, or one line saying how to install it."""
    try:
        import timm
    except ImportError:
        raise ConfigError(
            "The backbone network needs timm: pip install -e '.[images]' (or pip install timm)"
        ) from None
    return timm


def data_config(name: str) -> dict[str, Any]:
    """The input a timm network was trained on, from its pretrained configuration (no weights are
    read): ``image_size``, ``interpolation``, ``mean`` and ``std``, named as ``ImageFolderDataModule``
    names them."""
    timm = timm_module()
    check_name(timm, name)
    pretrained = timm.models.get_pretrained_cfg(name)
    config = timm.data.resolve_data_config(pretrained_cfg=pretrained.to_dict() if pretrained else {})
    return {
        "image_size": config["input_size"][-1],
        "interpolation": config["interpolation"] if config["interpolation"] in INTERPOLATIONS else "bilinear",
        "mean": list(config["mean"]),
        "std": list(config["std"]),
    }


def check_name(timm: Any, name: str) -> None:
    if not timm.is_model(name):
        nearest = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"did you mean {', '.join(nearest)}?" if nearest else "timm.list_models() lists them"
        raise ConfigError(f"{KEY}.name: timm has no network {name!r}; {hint}")


class Backbone(nn.Module):
    """A timm network with a new linear head for the data's classes.

    ``model.init_args.freeze_epochs`` and ``backbone_lr_scale`` fine-tune it: the head is
    ``head``, the rest is the backbone.

    Args:
        name: timm's name of the network (``timm.list_models()``): resnet18, convnext_nano,
            efficientnet_b0, vit_small_patch16_224, ...
        num_classes: the classes of the new head; the command line sets it from the data.
        weights: where the starting weights come from: null for random ones; ``pretrained`` for
            timm's own, from the Hugging Face Hub or its local cache; or the path of a local file:
            a state dict (``torch.save`` or safetensors) of this network, or a checkpoint of this
            project. The file's head is left out, so its classes need not be the data's.
        drop_rate: dropout before the head.
        channels_last: on a GPU, run in the channels-last memory format, which its convolutions
            run faster in.
    """

    def __init__(
        self,
        name: str = "resnet18",
        num_classes: int | None = None,
        weights: str | None = None,
        drop_rate: float = 0.0,
        channels_last: bool = True,
    ) -> None:
        super().__init__()
        if num_classes is None:
            raise ConfigError(f"{KEY}.num_classes: give it (the command line takes it from the data)")
        if weights is not None and weights.lower() in ("none", "null"):
            weights = None  # as the command line gives a nested null
        timm = timm_module()
        check_name(timm, name)
        self.name, self.channels_last, self.frozen = name, channels_last, False
        try:
            self.model = timm.create_model(
                name, pretrained=weights == "pretrained", num_classes=num_classes, drop_rate=drop_rate
            )
        except Exception as error:
            if weights != "pretrained":
                raise
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(
                f"{KEY}.weights=pretrained: timm could not get {name}'s weights ({reason}); where "
                "there is no network, save them to a file elsewhere and give its path"
            ) from None
        if weights not in (None, "pretrained"):
            self.load_body(Path(weights))

    @staticmethod
    def input_config(name: str = "resnet18", **_: Any) -> dict[str, Any]:
        """The input the network ``name`` was trained on (``data_config``), which the command line
        gives the data module where its config leaves it unset."""
        return data_config(name)

    @property
    def head(self) -> nn.Module:
        """The layer that maps features to class scores, new for the data's classes."""
        return self.model.get_classifier()

    def head_names(self) -> set[str]:
        head = {id(parameter) for parameter in self.head.parameters()}
        return {name for name, parameter in self.model.named_parameters() if id(parameter) in head}

    def load_body(self, path: Path) -> None:
        """Every weight but the head's from ``path``, refusing a file that does not fit with a line
        naming the first weight at fault."""
        try:
            state = read_checkpoint(path)
        except FileNotFoundError:
            raise ConfigError(f"{KEY}.weights: no such file {path}") from None
        except ValueError as error:
            raise ConfigError(f"{KEY}.weights: {error}") from None
        state = state.get("state_dict", state.get("model", state))
        for prefix in PREFIXES:
            if any(key.startswith(prefix) for key in state):
                state = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
        head = self.head_names()
        expected = {key: value for key, value in self.model.state_dict().items() if key not in head}
        given = {key: value for key, value in state.items() if key not in head}  # the file's head too
        for key, value in expected.items():
            if key not in given:
                raise ConfigError(f"{KEY}.weights: {path} does not fit {self.name}: it has no {key}")
            if tuple(given[key].shape) != tuple(value.shape):
                raise ConfigError(
                    f"{KEY}.weights: {path} does not fit {self.name}: {key} is "
                    f"{tuple(given[key].shape)} in the file, {tuple(value.shape)} in the network"
                )
        unexpected = sorted(given.keys() - expected.keys())
        if unexpected:
            raise ConfigError(
                f"{KEY}.weights: {path} does not fit {self.name}: it has {unexpected[0]}, "
                f"which the network has not ({len(unexpected)} such weights)"
            )
        self.model.load_state_dict(given, strict=False)

    def freeze(self, frozen: bool) -> None:
        """Freeze the backbone (all but the head): no gradients, and its batch-norm statistics kept
        as they are; or unfreeze it."""
        self.frozen = frozen
        head = self.head_names()
        for name, parameter in self.model.named_parameters():
            parameter.requires_grad_(not frozen or name in head)
        self.train(self.training)

    def train(self, mode: bool = True) -> "Backbone":
        super().train(mode)
        if mode and self.frozen:
            head = {id(module) for module in self.head.modules()}
            for module in self.model.modules():
                if isinstance(module, BATCH_NORMS) and id(module) not in head:
                    module.eval()
        return self

    def forward(self, x: Tensor) -> Tensor:
        if self.channels_last and x.is_cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.model(x)
