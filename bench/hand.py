"""The hand-written PyTorch loop the benchmark holds the generated project's training against.

It trains what ``python -m <package> fit`` trains by default, the way one would by hand: the
project's MLP class with the initial weights the Lightning run started from, the project's data
split, the same batch size, AdamW, warm-up + cosine schedule, gradient clipping by norm, fp32,
deterministic algorithms and number of optimizer steps; the loss written to a CSV file every
``--log-every`` steps; accuracy and macro F1 on the validation split and a checkpoint (last,
and best by validation accuracy) after every epoch. The data is the project's digits split, or
the file given with ``--data-file`` split by the project's ``FileDataModule``. Batches are drawn
by indexing the in-memory tensors with a shuffled order, the fastest way to serve them by hand.
"""

import argparse
import importlib
import json
import math
import os
import resource
import time
from pathlib import Path

import torch
import yaml
from torch.nn import functional
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR


def evaluate(network, features, labels, batch_size, num_classes):
    """Mean loss, accuracy and macro F1 over a split, from a confusion matrix."""
    network.eval()
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64)
    total_loss = 0.0
    with torch.inference_mode():
        for start in range(0, len(labels), batch_size):
            x, y = features[start : start + batch_size], labels[start : start + batch_size]
            logits = network(x)
            total_loss += functional.cross_entropy(logits, y, reduction="sum").item()
            confusion += torch.bincount(y * num_classes + logits.argmax(1), minlength=num_classes**2)
    confusion = confusion.view(num_classes, num_classes).double()
    true_positives = confusion.diag()
    f1 = 2 * true_positives / (confusion.sum(0) + confusion.sum(1)).clamp(min=1)
    network.train()
    return total_loss / len(labels), (true_positives.sum() / confusion.sum()).item(), f1.mean().item()


def arguments(description: str) -> argparse.ArgumentParser:
    """The arguments this loop and ``bare.py`` share: what to train, and where to write."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--package", required=True)
    parser.add_argument("--init", required=True, help="initial network weights saved by the Lightning run")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps the Lightning run took")
    parser.add_argument("--max-epochs", type=int, required=True, help="sets the schedule's length")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument(
        "--hidden-sizes", default="256,128", help="the MLP's hidden layer sizes, comma-separated"
    )
    parser.add_argument(
        "--data-file", help="train on this .npz file (FileDataModule, not standardised) instead of digits"
    )
    parser.add_argument(
        "--images",
        help="bare.py only: train the project's ConvNet on this folder of class folders, with the "
        "project's configs/data/images.yaml and configs/model/cnn.yaml (run in the project)",
    )
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    return parser


def data_module(args: argparse.Namespace):
    """The project's data module of the workload: digits, or the file, as the project's run has it."""
    data = importlib.import_module(f"{args.package}.data")
    if args.images:
        settings = yaml.safe_load(Path("configs/data/images.yaml").read_text())["data"]["init_args"]
        return data.ImageFolderDataModule(**{**settings, "root": args.images, "batch_size": args.batch_size})
    if args.data_file:
        return data.FileDataModule(path=args.data_file, standardize=False, batch_size=args.batch_size)
    return data.DigitsDataModule(batch_size=args.batch_size)


def main() -> None:
    parser = arguments(__doc__)
    args = parser.parse_args()
    if args.images:
        parser.error("--images: the hand loop trains on tensors in memory; bare.py takes images")

    torch.use_deterministic_algorithms(True)
    torch.manual_seed(42)
    package = importlib.import_module(args.package)
    data = data_module(args)
    data.setup("fit")
    x_train, y_train = data.splits["train"].tensors
    x_val, y_val = data.splits["val"].tensors
    network = importlib.import_module(f"{args.package}.models").MLP(
        in_features=64, num_classes=10, hidden_sizes=[int(size) for size in args.hidden_sizes.split(",")]
    )
    network.load_state_dict(torch.load(args.init, weights_only=True))
    model = torch.compile(network) if args.compile else network
    lr_factor = importlib.import_module(f"{args.package}.framework.models.parts").lr_factor
    del package

    optimizer = AdamW(network.parameters(), lr=3e-3, weight_decay=0.01)
    total_steps = args.max_epochs * math.ceil(len(y_train) / args.batch_size)
    scheduler = LambdaLR(optimizer, lambda step: lr_factor(step, 50, total_steps))
    order_generator = torch.Generator().manual_seed(42)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log = (workdir / "metrics.csv").open("w")
    log.write("step,train_loss\n")

    fit_started = time.perf_counter()
    step, first_step, first_step_wall, val_times, val_in_span, best = 0, None, None, [], 0.0, -1.0
    intervals, boundaries, last_step = [], [], 0.0
    network.train()
    for epoch in range(args.max_epochs):
        order = torch.randperm(len(y_train), generator=order_generator)
        for start in range(0, len(y_train), args.batch_size):
            index = order[start : start + args.batch_size]
            loss = functional.cross_entropy(model(x_train[index]), y_train[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            if step % args.log_every == 0:
                log.write(f"{step},{loss.item()}\n")
            now = time.perf_counter()
            if first_step is None:
                first_step_wall, first_step = time.time(), now
            elif start == 0:
                boundaries.append(now - last_step - val_times[-1])
            else:
                intervals.append(now - last_step)
            last_step = now
            if step == args.steps:
                break
        val_started = time.perf_counter()
        val_loss, val_acc, val_f1 = evaluate(model, x_val, y_val, args.batch_size, 10)
        log.write(f"# epoch {epoch} val_loss {val_loss:.4f} val_acc {val_acc:.4f} val_f1 {val_f1:.4f}\n")
        val_times.append(time.perf_counter() - val_started)
        if step < args.steps:
            val_in_span += val_times[-1]
        state = {"network": network.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        state["scheduler"] = scheduler.state_dict()
        torch.save(state, workdir / "last.pt")
        if val_acc > best:
            best = val_acc
            torch.save(state, workdir / "best.pt")
        if step == args.steps:
            break
    log.close()
    fit_s = time.perf_counter() - fit_started
    result = {
        "first_step_wall": first_step_wall,
        "lightning_imported_wall": float(os.environ.get("BENCH_LIGHTNING_IMPORTED", "nan")),
        "train_s": last_step - first_step - val_in_span,
        "fit_s": fit_s,
        "steps": step,
        "intervals_s": intervals,
        "boundaries_s": boundaries,
        "val_epoch_s": val_times,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "val_acc": val_acc,
    }
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
