"""The test report, as PNG and CSV in the run directory: the confusion matrix and per-class
metrics of a classifier, the predictions against the true values and the residuals of a regressor."""

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from torch import Tensor
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import (
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
)
from torchmetrics.utilities import dim_zero_cat

from .tracking import WandbLogger

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PER_CLASS = ("precision", "recall", "f1")


class TestReport(Callback):
    """Accumulates the outputs that ``test_step`` returns and, at the end of the test epoch, writes
    into the run directory, for a classifier (outputs: logits):

    - ``confusion_matrix.png`` and ``.csv``: sample counts, true class by row, predicted by column;
    - ``per_class_metrics.png`` and ``.csv``: precision, recall, F1 and support of every class;

    and for a regressor (outputs: predictions in the target's units):

    - ``predictions_vs_true.png``: each sample's prediction against its true value, beside the
      line of perfect predictions;
    - ``residuals.png``: each residual (true - predicted) against the prediction;
    - ``residuals.csv``: the residuals' count, mean (the bias), standard deviation, and the mean,
      root mean square, median, 90th percentile and largest of their absolute values.

    Classes are named as in the data. The images also go to TensorBoard and Weights & Biases when
    those loggers are active (the CSV logger keeps no images; the PNG files are the record). The
    metrics are torchmetrics', gathered over all processes under DDP; only global rank 0 writes.
    """

    __test__ = False  # tells pytest that this is not a test class, despite its name

    def __init__(self) -> None:
        self.metrics: Metric | MetricCollection | None = None

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
        if not isinstance(outputs, Tensor) or _reported(pl_module) is None:
            return
        if self.metrics is None:
            regression = _reported(pl_module) == "regression"
            metrics = PredictedAndTrue() if regression else classification_metrics(outputs.shape[-1])
            self.metrics = metrics.to(outputs.device)
        self.metrics.update(outputs, batch[1])

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.metrics is None:
            return
        results = {name: value.cpu() for name, value in self.metrics.compute().items()}
        self.metrics.reset()
        if trainer.is_global_zero:
            directory = Path(trainer.default_root_dir)
            directory.mkdir(parents=True, exist_ok=True)
            if _reported(pl_module) == "regression":
                images = write_regression_report(directory, results["predicted"], results["true"])
            else:
                images = write_classification_report(directory, results, pl_module.class_names)
            log_images(trainer, images)


def _reported(pl_module: LightningModule) -> str | None:
    """What the report is of: a regression model's predictions, or a classifier's classes (it names
    them); None for a module of one's own, whose test outputs may be anything."""
    if getattr(pl_module, "task", None) == "regression":
        return "regression"
    return "classification" if getattr(pl_module, "class_names", None) is not None else None


class PredictedAndTrue(Metric):
    """Every sample's prediction and true value, gathered from all processes."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("predicted", default=[], dist_reduce_fx="cat")
        self.add_state("true", default=[], dist_reduce_fx="cat")

    def update(self, predicted: Tensor, true: Tensor) -> None:
        self.predicted.append(predicted.float())
        self.true.append(true.float())

    def compute(self) -> dict[str, Tensor]:
        return {"predicted": dim_zero_cat(self.predicted), "true": dim_zero_cat(self.true)}


def classification_metrics(classes: int) -> MetricCollection:
    return MetricCollection(
        {
            "confusion_matrix": MulticlassConfusionMatrix(classes),
            "precision": MulticlassPrecision(classes, average=None),
            "recall": MulticlassRecall(classes, average=None),
            "f1": MulticlassF1Score(classes, average=None),
        }
    )


def write_classification_report(
    directory: Path, results: dict[str, Tensor], class_names: list[str]
) -> dict[str, Path]:
    """Write the CSV and PNG files; return the images by name."""
    from matplotlib.figure import Figure  # only a test report draws, so only it imports matplotlib

    confusion = results["confusion_matrix"]
    with (directory / "confusion_matrix.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["true \\ predicted", *class_names])
        writer.writerows([name, *row] for name, row in zip(class_names, confusion.tolist(), strict=True))
    support = confusion.sum(dim=1).tolist()
    with (directory / "per_class_metrics.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["class", *PER_CLASS, "support"])
        values = zip(*(results[name].tolist() for name in PER_CLASS), strict=True)
        writer.writerows(
            [name, *(f"{v:.6f}" for v in row), count]
            for name, row, count in zip(class_names, values, support, strict=True)
        )

    rotation = 90 if sum(map(len, class_names)) > 40 else 0  # names that would overlap, turned
    figure = Figure(figsize=(6, 5.5), layout="constrained")
    axes = figure.subplots()
    MulticlassConfusionMatrix(len(confusion)).plot(
        val=confusion, ax=axes, add_text=len(confusion) <= 30, labels=class_names
    )
    axes.tick_params(axis="x", labelrotation=rotation)
    images = {"confusion_matrix": figure}

    figure = Figure(figsize=(max(7.0, 0.45 * len(confusion)), 4), layout="constrained")
    axes = figure.subplots()
    width = 0.8 / len(PER_CLASS)
    for offset, name in enumerate(PER_CLASS):
        positions = [c + (offset - 1) * width for c in range(len(class_names))]
        axes.bar(positions, results[name].tolist(), width, label=name)
    axes.set_xticks(range(len(class_names)), class_names, rotation=rotation)
    axes.set(ylim=(0, 1), xlabel="class", ylabel="score", title="test, per class")
    figure.legend(loc="outside right upper")
    images["per_class_metrics"] = figure
    return save(directory, images)


def write_regression_report(directory: Path, predicted: Tensor, true: Tensor) -> dict[str, Path]:
    """Write the CSV and PNG files; return the images by name."""
    from matplotlib.figure import Figure

    residuals = true - predicted
    absolute = residuals.abs()
    statistics = {
        "samples": len(residuals),
        "mean": residuals.mean(),
        "std": residuals.std(),
        "mean_absolute": absolute.mean(),
        "root_mean_square": residuals.square().mean().sqrt(),
        "median_absolute": absolute.median(),
        "p90_absolute": absolute.quantile(0.9),
        "max_absolute": absolute.max(),
    }
    with (directory / "residuals.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["statistic", "value"])
        writer.writerows([name, f"{float(value):.7g}"] for name, value in statistics.items())

    marker = {"s": 12, "alpha": 0.6}
    figure = Figure(figsize=(6, 5.5), layout="constrained")
    axes = figure.subplots()
    axes.scatter(true, predicted, **marker)
    low, high = min(true.min(), predicted.min()).item(), max(true.max(), predicted.max()).item()
    axes.plot([low, high], [low, high], color="gray", linestyle="--", label="predicted = true")
    axes.set(xlabel="true", ylabel="predicted", title=f"test: predicted against true, {len(true)} samples")
    axes.legend(loc="upper left")
    images = {"predictions_vs_true": figure}

    figure = Figure(figsize=(6, 4.5), layout="constrained")
    axes = figure.subplots()
    axes.scatter(predicted, residuals, **marker)
    axes.axhline(0, color="gray", linestyle="--")
    axes.set(
        xlabel="predicted",
        ylabel="residual (true - predicted)",
        title=f"test: residuals, mean {statistics['mean']:.3g}, RMS {statistics['root_mean_square']:.3g}",
    )
    images["residuals"] = figure
    return save(directory, images)


def save(directory: Path, images: dict[str, "Figure"]) -> dict[str, Path]:
    """Save each figure as ``<name>.png``; return the files by name."""
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
            elif isinstance(logger, WandbLogger | LightningWandbLogger):
                logger.log_image(key=f"test/{name}", images=[str(path)])
