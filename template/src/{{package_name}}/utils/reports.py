"""The test report: confusion matrix and per-class metrics, as PNG and CSV in the run directory."""

import csv
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
)

PER_CLASS = ("precision", "recall", "f1")


class TestReport(Callback):
    """Accumulates the logits that ``test_step`` returns and, at the end of the test epoch, writes
    into the run directory:

    - ``confusion_matrix.png`` and ``.csv``: sample counts, true class by row, predicted by column;
    - ``per_class_metrics.png`` and ``.csv``: precision, recall, F1 and support of every class.

    Both images also go to TensorBoard and Weights & Biases when those loggers are active (the
    CSV logger keeps no images; the PNG files are the record). The metrics are torchmetrics',
    gathered over all processes under DDP; only global rank 0 writes.
    """

    __test__ = False  # tells pytest that this is not a test class, despite its name

    def __init__(self) -> None:
        self.metrics: MetricCollection | None = None

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.metrics = None

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not isinstance(outputs, torch.Tensor):
            return
        if self.metrics is None:
            classes = outputs.shape[-1]
            per_class = {
                "precision": MulticlassPrecision(classes, average=None),
                "recall": MulticlassRecall(classes, average=None),
                "f1": MulticlassF1Score(classes, average=None),
            }
            self.metrics = MetricCollection(
                {"confusion_matrix": MulticlassConfusionMatrix(classes), **per_class}
            ).to(outputs.device)
        self.metrics.update(outputs, batch[1])

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.metrics is None:
            return
        results = {name: value.cpu() for name, value in self.metrics.compute().items()}
        self.metrics.reset()
        if trainer.is_global_zero:
            directory = Path(trainer.default_root_dir)
            directory.mkdir(parents=True, exist_ok=True)
            log_images(trainer, write_report(directory, results))


def write_report(directory: Path, results: dict[str, torch.Tensor]) -> dict[str, Path]:
    """Write the CSV and PNG files; return the images by name."""
    from matplotlib.figure import Figure  # only a test report draws, so only it imports matplotlib

    confusion = results["confusion_matrix"]
    classes = range(len(confusion))
    with (directory / "confusion_matrix.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["true \\ predicted", *classes])
        writer.writerows([label, *row] for label, row in zip(classes, confusion.tolist(), strict=True))
    support = confusion.sum(dim=1).tolist()
    with (directory / "per_class_metrics.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["class", *PER_CLASS, "support"])
        values = zip(*(results[name].tolist() for name in PER_CLASS), strict=True)
        writer.writerows(
            [label, *(f"{v:.6f}" for v in row), count]
            for label, row, count in zip(classes, values, support, strict=True)
        )

    figure = Figure(figsize=(6, 5.5), layout="constrained")
    MulticlassConfusionMatrix(len(confusion)).plot(
        val=confusion, ax=figure.subplots(), add_text=len(confusion) <= 30
    )
    images = {"confusion_matrix": figure}

    figure = Figure(figsize=(max(7.0, 0.45 * len(confusion)), 4), layout="constrained")
    axes = figure.subplots()
    width = 0.8 / len(PER_CLASS)
    for offset, name in enumerate(PER_CLASS):
        positions = [c + (offset - 1) * width for c in classes]
        axes.bar(positions, results[name].tolist(), width, label=name)
    axes.set(xticks=list(classes), ylim=(0, 1), xlabel="class", ylabel="score", title="test, per class")
    figure.legend(loc="outside right upper")
    images["per_class_metrics"] = figure

    paths = {}
    for name, figure in images.items():
        paths[name] = directory / f"{name}.png"
        figure.savefig(paths[name], dpi=100)
    return paths


def log_images(trainer: Trainer, images: dict[str, Path]) -> None:
    """Send the report's images to the loggers that keep images: TensorBoard and Weights & Biases."""
    for logger in trainer.loggers:
        for name, path in images.items():
            if isinstance(logger, TensorBoardLogger):
                from matplotlib.image import imread

                image = torch.from_numpy(imread(path)[..., :3])
                logger.experiment.add_image(f"test/{name}", image, trainer.global_step, dataformats="HWC")
            elif isinstance(logger, WandbLogger):
                logger.log_image(key=f"test/{name}", images=[str(path)])
