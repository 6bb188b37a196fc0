"""Lightning's own floor: the hand loop's training, run by a Lightning ``Trainer`` with nothing on.

Same work as ``hand.py`` (the project's MLP with the same initial weights, data split, batch
size, AdamW, warm-up + cosine schedule, clipping by norm, fp32, deterministic algorithms, steps;
the loss written to a CSV file every ``--log-every`` steps; validation accuracy and macro F1 and
a ``torch.save`` checkpoint, last and best, after every epoch), in a minimal ``LightningModule``
trained by ``Trainer`` with no logger, no checkpoint callbacks, no progress bar and no model
summary, on the project's data module (the loaders the project's ``fit`` uses); ``--manual``
uses manual optimization instead (clipping by hand). ``--devices 2`` trains in two CPU processes
with Lightning's DDP over gloo, as the project's ``configs/trainer/ddp_cpu.yaml`` does: the first
process writes the loss and the checkpoints, and the validation counts are summed over both. Timed by the same
``BenchClock`` callback as the project's run. What this costs over ``hand.py`` is the cost of
Lightning's training loop itself, which no project built on the ``Trainer`` can go below.
"""

import importlib
import math
from pathlib import Path

import torch
import yaml
from clock import BenchClock
from hand import arguments, data_module
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import DDPStrategy
from torch.nn import functional
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR


class Bare(LightningModule):
    def __init__(self, network, schedule, workdir: Path, log_every: int, manual: bool, num_classes: int = 10):
        super().__init__()
        self.automatic_optimization = not manual
        self.network = network
        self.schedule = schedule
        self.workdir = workdir
        self.log_every = log_every
        self.num_classes = num_classes
        self.log_file = None
        self.confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64)
        self.val_loss = 0.0
        self.best = -1.0

    def on_fit_start(self) -> None:
        if self.trainer.is_global_zero:
            self.log_file = (self.workdir / "metrics.csv").open("w")
            self.log_file.write("step,train_loss\n")

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = functional.cross_entropy(self.network(x), y)
        if not self.automatic_optimization:
            optimizer, scheduler = self.optimizers(), self.lr_schedulers()
            optimizer.zero_grad(set_to_none=True)
            self.manual_backward(loss)
            torch.nn.utils.clip_grad_norm_(self.network.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
        if self.log_file and (self.global_step + 1) % self.log_every == 0:
            self.log_file.write(f"{self.global_step + 1},{loss.item()}\n")
        return loss

    def validation_step(self, batch, batch_idx) -> None:
        x, y = batch
        logits = self.network(x)
        self.val_loss += functional.cross_entropy(logits, y, reduction="sum").item()
        cells = y * self.num_classes + logits.argmax(1)
        self.confusion += torch.bincount(cells, minlength=self.num_classes**2)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.world_size > 1:
            torch.distributed.all_reduce(self.confusion)
        confusion = self.confusion.view(self.num_classes, self.num_classes).double()
        true_positives = confusion.diag()
        f1 = 2 * true_positives / (confusion.sum(0) + confusion.sum(1)).clamp(min=1)
        self.val_acc = (true_positives.sum() / confusion.sum()).item()
        self.log("val/acc", self.val_acc)
        samples = confusion.sum().item()
        if self.log_file:
            self.log_file.write(
                f"# epoch {self.current_epoch} val_loss {self.val_loss / samples:.4f} "
                f"val_acc {self.val_acc:.4f} val_f1 {f1.mean().item():.4f}\n"
            )
        self.confusion.zero_()
        self.val_loss = 0.0

    def on_train_epoch_end(self) -> None:
        if not self.trainer.is_global_zero:
            return
        optimizer, scheduler = self.optimizers().optimizer, self.lr_schedulers()
        state = {"network": self.network.state_dict(), "optimizer": optimizer.state_dict()}
        state["epoch"], state["scheduler"] = self.current_epoch, scheduler.state_dict()
        torch.save(state, self.workdir / "last.pt")
        if self.val_acc > self.best:
            self.best = self.val_acc
            torch.save(state, self.workdir / "best.pt")

    def on_fit_end(self) -> None:
        if self.log_file:
            self.log_file.close()

    def configure_optimizers(self):
        optimizer = AdamW(self.network.parameters(), lr=3e-3, weight_decay=0.01)
        scheduler = LambdaLR(optimizer, self.schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def build_network(args) -> torch.nn.Module:
    """The project's MLP, or with ``--images`` its ConvNet as configs/model/cnn.yaml sets it."""
    if args.images:
        model = yaml.safe_load(Path("configs/model/cnn.yaml").read_text())["model"]["init_args"]
        settings = {**model["network"]["init_args"], "num_classes": 10}
        return importlib.import_module(f"{args.package}.models.convnet").ConvNet(**settings)
    return importlib.import_module(f"{args.package}.models").MLP(
        in_features=64, num_classes=10, hidden_sizes=[int(size) for size in args.hidden_sizes.split(",")]
    )


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--manual", action="store_true", help="manual optimization, clipping by hand")
    parser.add_argument("--devices", type=int, default=1, help="CPU processes (DDP over gloo above 1)")
    args = parser.parse_args()

    torch.manual_seed(42)
    data = data_module(args)
    network = build_network(args)
    network.load_state_dict(torch.load(args.init, weights_only=True))
    if args.compile:
        network.compile()
    lr_factor = importlib.import_module(f"{args.package}.framework.models.parts").lr_factor
    data.setup("fit")
    samples = len(data.files["train"]) if args.images else len(data.splits["train"])
    total_steps = args.max_epochs * math.ceil(samples / args.batch_size / args.devices)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    schedule = lambda step: lr_factor(step, 50, total_steps)  # noqa: E731
    model = Bare(network, schedule, workdir, args.log_every, args.manual)
    trainer = Trainer(
        max_epochs=args.max_epochs,
        max_steps=args.steps,
        accelerator="cpu",
        devices=args.devices,
        strategy=DDPStrategy(process_group_backend="gloo") if args.devices > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=None if args.manual else 1.0,
        deterministic=True,
        callbacks=[BenchClock(args.out)],
    )
    trainer.fit(model, datamodule=data)


if __name__ == "__main__":
    main()
