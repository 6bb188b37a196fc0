"""Export a checkpoint's model to ONNX and torch.export with its metadata, and check every export
against the eager model on real test samples.

Usage:
    pip install -e ".[export]"      # onnx, onnxscript and onnxruntime, for the ONNX export
    python scripts/export.py --ckpt_path checkpoints/<run_name>/best-epoch=NNN.ckpt
    python scripts/export.py --ckpt_path ... --formats onnx torch_export

Writes into ``export-<checkpoint name>/`` beside the checkpoint:

- ``model.onnx`` (weights in ``model.onnx.data``): ONNX, for onnxruntime and other runtimes;
  input ``features``, output ``logits`` (a classifier) or ``prediction`` (a regressor);
- ``model.pt2``: a ``torch.export`` program: ``torch.export.load(path).module()(features)``.
  It is also what PyTorch now offers in place of TorchScript, which it deprecates;
- ``metadata.json``: the input's columns in order, each categorical column's categories, and the
  class names or the target. The same text is in ``model.onnx``'s metadata, under ``metadata``
  (onnxruntime: ``session.get_modelmeta().custom_metadata_map["metadata"]``), and in
  ``model.pt2`` as the extra file ``metadata.json``
  (``torch.export.load(path, extra_files={"metadata.json": ""})`` fills that dictionary).

A text model's take int64 token ids, ``[batch, tokens]``, of any number of texts and tokens: each
text encoded by the checkpoint's tokenizer (``metadata.json``'s ``input.tokenizer``, the JSON of
Hugging Face ``tokenizers``), cut to its first ``max_length`` ids and padded with ``pad_id``, the
tokenizer's padding id, to the longest text of the batch; where ``pad_id`` is not 0 (RoBERTa's
tokenizer), ``pad_id`` and 0 then trade places. The model takes id 0 for padding and derives the
padding mask from it itself: the padding changes no text's outputs.

An image model's exports take a uint8 batch of any size of RGB images, channels first, as an
image file decodes, resized and centre-cropped to the checkpoint's evaluation size as ``predict``
does (``metadata.json`` says how): they scale and normalise the pixels themselves.

A table model's take a float32 batch of any size of raw features, as in the data: the model
standardises and one-hot encodes them itself, as in training. The numeric columns come first, then one column
per categorical feature holding the index of the sample's category in its list of categories, or
-1 for a category not seen in training. A model trained with ``data.init_args.missing=impute``
takes NaN for a missing number and imputes it as ``predict`` does (the training split's median);
a missing text value is the category ``missing``. Each returns the class logits (softmax gives the
probabilities) or the predictions in the target's own units. Each is run on the checkpoint's
test split and compared with the eager model on the inputs ``predict`` gives it for the same
samples; the script prints the largest difference, and exits with an error if any output differs
by more than ``--atol``, relative to the output where that is larger than 1.
"""

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from torch import nn
from torchvision.transforms import v2

from .data import ImageFolderDataModule
from .data.images import CENTRE_CROP_RATIO, read_image
from .data.tables import MISSING_CATEGORY
from .data.text import concatenated, padding_id, tokenizers_module
from .models import Classifier
from .models.trained import load_trained
from .runs.checkpoints import read_checkpoint

# A deprecated call inside torch.export itself, which nothing here can act on.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")

FILES = {"onnx": "model.onnx", "torch_export": "model.pt2"}


def load(checkpoint: Path) -> tuple[LightningModule, LightningDataModule]:
    """The checkpoint's model in eval mode on the CPU, and its data, encoded as in training."""
    model, data = load_trained(checkpoint)
    data.setup("test")
    # The preprocessing the checkpoint was trained with, in case the data file has changed since.
    state = read_checkpoint(checkpoint).get(type(data).__qualname__)
    if state:
        data.load_state_dict(state)
    return model, data


class ImageInput(nn.Module):
    """An image model that takes uint8 pixels, resized and centre-cropped to its evaluation size,
    and scales and normalises them itself, as the data module's evaluation transform does."""

    def __init__(self, model: nn.Module, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model((images.float() / 255 - self.mean) / self.std)


def exported_inputs(
    model: LightningModule, data: LightningDataModule
) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """What is exported, its input on the test split's samples, and the eager model's outputs on
    them as ``predict`` gives them (images: through the data module's own evaluation transform)."""
    batches = concatenated([batch[0] for batch in data.test_dataloader()])
    with torch.inference_mode():
        expected = model(batches)
    if not isinstance(data, ImageFolderDataModule):
        return model, batches, expected
    resized = v2.Compose(data.transform(train=False).transforms[:-2])  # without scaling and normalising
    images = torch.stack([resized(read_image(path)) for path in data.files["test"]])
    return ImageInput(model, data.hparams.mean, data.hparams.std).eval(), images, expected


def describe(model: LightningModule, data: LightningDataModule, features: torch.Tensor) -> dict[str, Any]:
    """The exports' metadata: what their input holds and what their output means."""
    preprocess = model.preprocess
    dtype = str(features.dtype).removeprefix("torch.")
    inputs = {"name": "features", "dtype": dtype, "shape": ["batch", *features.shape[1:]]}
    if isinstance(data, ImageFolderDataModule):
        size, resize = data.hparams.image_size, round(data.hparams.image_size / CENTRE_CROP_RATIO)
        inputs |= {
            "name": "images",
            "mean": list(data.hparams.mean),
            "std": list(data.hparams.std),
            "interpolation": data.hparams.interpolation,
            "resize": resize,
            "description": "RGB images, channels first, uint8 pixels as decoded from an image file, the "
            f"shorter side resized to {resize} ({data.hparams.interpolation}, "
            "antialiased) and the centre "
            f"{size} x {size} cropped; the model scales the pixels to [0, 1] and normalises each "
            "channel, (pixel - mean) / std, itself",
        }
    elif preprocess.tokenizer:
        inputs |= {
            "name": "ids",
            "shape": ["batch", "tokens"],
            "tokenizer": json.loads(preprocess.tokenizer),
            "max_length": data.hparams.max_length,
            "pad_id": padding_id(tokenizers_module().Tokenizer.from_str(preprocess.tokenizer)),
            "text_column": data.text_column,
            "description": "token ids, one row per text: the text, stripped of spaces at its ends, encoded "
            "by tokenizer (the JSON of Hugging Face tokenizers), cut to its first max_length ids and "
            "padded with pad_id to the longest text of the batch, then, if pad_id is not 0, ids pad_id "
            "and 0 traded; the model takes id 0 for padding and leaves it out",
        }
    else:
        inputs |= {
            "columns": [*preprocess.numeric, *preprocess.categories],
            "categories": preprocess.categories,
            "unseen_category": -1,
            "description": "raw features, one row per sample, in the order of columns: the numeric ones as "
            "in the data, then for each categorical column the index of the sample's value in "
            "categories[column], or -1 for a value not seen in training",
        }
        if preprocess.median.numel():
            inputs["missing"] = (
                "NaN for a missing numeric value, imputed with the training split's median; the category "
                f"{MISSING_CATEGORY!r} for a missing text value"
            )
            inputs["missing_category"] = MISSING_CATEGORY
    if isinstance(model, Classifier):
        classes = {
            "name": "logits",
            "classes": model.class_names,
            "description": "one logit per class, in the order of classes; softmax gives the probabilities",
        }
        return {"task": "classification", "input": inputs, "output": classes}
    target = {
        "name": "prediction",
        "target": data.table.label_name,
        "description": "the predicted target, one value per sample, in the target's own units",
    }
    return {"task": "regression", "input": inputs, "output": target}


def export(model: nn.Module, features: torch.Tensor, kind: str, path: Path, metadata: str) -> Callable:
    """Write one export, with the metadata in it; return a function that runs the exported file on
    a batch of features."""
    # The axes the metadata names (batch; tokens, of texts) are dynamic, the others fixed.
    shape = json.loads(metadata)["input"]["shape"]
    dynamic = (
        {axis: torch.export.Dim(name, min=1) for axis, name in enumerate(shape) if isinstance(name, str)},
    )
    if kind == "torch_export":
        program = torch.export.export(model, (features,), dynamic_shapes=dynamic)
        torch.export.save(program, path, extra_files={"metadata.json": metadata})
        return torch.export.load(path).module()
    try:
        import onnxruntime
    except ImportError:
        sys.exit('error: the ONNX export needs onnx, onnxscript and onnxruntime: pip install -e ".[export]"')
    output = json.loads(metadata)["output"]["name"]
    program = torch.onnx.export(
        model,
        (features,),
        dynamo=True,
        input_names=[json.loads(metadata)["input"]["name"]],
        output_names=[output],
        dynamic_shapes=dynamic,
        verbose=False,
    )
    program.model.metadata_props["metadata"] = metadata
    program.save(path, external_data=True)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: torch.from_numpy(session.run([output], {name: x.numpy()})[0])


def difference(outputs: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest difference from the eager model's outputs, relative to each output larger than 1
    (float32 keeps about 7 significant digits, whatever the outputs' units)."""
    return ((outputs - expected).abs() / expected.abs().clamp(min=1)).max().item()


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Export, check, print a table; return each format's largest difference from the eager model."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt_path", type=Path, required=True, help="the Lightning checkpoint to export")
    parser.add_argument("--formats", nargs="+", choices=list(FILES), default=list(FILES))
    parser.add_argument("--output_dir", type=Path, help="default: export-<checkpoint name>/ beside it")
    parser.add_argument(
        "--atol",
        type=float,
        default=1e-5,
        help="largest difference allowed; relative to the output where that is larger than 1",
    )
    args = parser.parse_args(argv)
    try:
        model, data = load(args.ckpt_path)
    except (FileNotFoundError, ValueError) as error:
        parser.error(f"--ckpt_path: {error}")
    output_dir = args.output_dir or args.ckpt_path.parent / f"export-{args.ckpt_path.stem}"
    output_dir.mkdir(parents=True, exist_ok=True)
    exported, features, expected = exported_inputs(model, data)
    metadata = json.dumps(describe(model, data, features), indent=2) + "\n"
    (output_dir / "metadata.json").write_text(metadata)

    differences = {}
    for kind in args.formats:
        path = output_dir / FILES[kind]
        run = export(exported, features, kind, path, metadata)
        with torch.inference_mode():
            differences[kind] = difference(run(features), expected)
        print(f"{kind:<13} {path!s:<60} max difference {differences[kind]:.2e}")
    failed = {kind: value for kind, value in differences.items() if not value <= args.atol}
    if failed:
        sys.exit(f"error: outputs differ from the eager model by more than --atol={args.atol}: {failed}")
    return differences


if __name__ == "__main__":
    main()
