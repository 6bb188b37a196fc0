"""The in-process side of ``bench/sweep.py``: an Optuna study over a bare Lightning ``Trainer``
and a plain ``LightningModule``, every trial in this one process, as lightning-hydra-template's
Hydra-Optuna multirun runs them (the imports are paid once).

The work of each trial is the generated project's default fit: the digits (70% training, 15%
validation, stratified, seed 0, features scaled to [0, 1]), an MLP of 256 and 128 hidden units
with batch norm and dropout, batch 64, AdamW with weight decay 0.01, warm-up then cosine decay,
clipping at norm 1, deterministic algorithms, the ``Trainer``'s defaults otherwise (its progress
bar, checkpoint and logger). The study: TPE seeded with the sweep's seed, its random start-up
trials as many; the trial's value is its best ``val/acc``. Writes each ``trainer.fit``'s wall
time to ``--out`` (JSON).

    python bench/sweep_loop.py --trials 8 --epochs 4 --workdir DIR --out FILE
"""

import argparse
import json
import math
import time
from pathlib import Path

import lightning
import optuna
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

# The sweep file's names and ranges (bench/sweep.py writes the same into the project's).
LR, DROPOUT = "model.init_args.lr", "model.init_args.network.init_args.dropout"
LR_RANGE, DROPOUT_RANGE = (3e-4, 3e-2), (0.0, 0.3)
BATCH_SIZE, WARMUP_STEPS = 64, 50


class PlainClassifier(lightning.LightningModule):
    def __init__(self, lr: float, dropout: float, total_steps: int) -> None:
        super().__init__()
        self.lr, self.total_steps = lr, total_steps
        layers: list[nn.Module] = []
        width = 64
        for hidden in (256, 128):
            layers += [nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        self.network = nn.Sequential(*layers, nn.Linear(width, 10))
        self.best_acc = 0.0

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = functional.cross_entropy(self.network(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx) -> None:
        x, y = batch
        logits = self.network(x)
        self.log("val/loss", functional.cross_entropy(logits, y))
        self.log("val/acc", (logits.argmax(1) == y).float().mean())

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.best_acc = max(self.best_acc, float(self.trainer.callback_metrics["val/acc"]))

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.network.parameters(), lr=self.lr, weight_decay=0.01)

        def factor(step: int) -> float:
            if step < WARMUP_STEPS:
                return (step + 1) / WARMUP_STEPS
            progress = min(1.0, (step - WARMUP_STEPS) / max(1, self.total_steps - WARMUP_STEPS))
            return 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def loaders() -> tuple[DataLoader, DataLoader]:
    digits = load_digits()
    features = torch.tensor(digits.data / 16, dtype=torch.float32)
    labels = torch.tensor(digits.target)
    train, rest = train_test_split(range(len(labels)), test_size=0.3, stratify=labels, random_state=0)
    val, _ = train_test_split(rest, test_size=0.5, stratify=labels[rest], random_state=0)
    train_set = TensorDataset(features[train], labels[train])
    val_set = TensorDataset(features[val], labels[val])
    return DataLoader(train_set, BATCH_SIZE, shuffle=True), DataLoader(val_set, BATCH_SIZE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed, the sweep file's")
    parser.add_argument("--startup-trials", type=int, default=4, help="TPE's random trials first")
    parser.add_argument("--workdir", type=Path, required=True, help="the trainers' default_root_dir")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    train, val = loaders()
    total_steps = args.epochs * len(train)
    fit_times: list[float] = []

    def objective(trial: optuna.Trial) -> float:
        lightning.seed_everything(42, verbose=False)
        model = PlainClassifier(
            trial.suggest_float(LR, *LR_RANGE, log=True),
            trial.suggest_float(DROPOUT, *DROPOUT_RANGE),
            total_steps,
        )
        trainer = lightning.Trainer(
            max_epochs=args.epochs,
            accelerator="cpu",
            deterministic=True,
            gradient_clip_val=1.0,
            default_root_dir=args.workdir / f"trial-{trial.number}",
        )
        started = time.perf_counter()
        trainer.fit(model, train, val)
        fit_times.append(time.perf_counter() - started)
        return model.best_acc

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(n_startup_trials=args.startup_trials, seed=args.seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(objective, n_trials=args.trials)
    print(f"best val/acc {study.best_value:.4f} with {study.best_params}")
    args.out.write_text(json.dumps({"fit_s": fit_times, "best_value": study.best_value}))


if __name__ == "__main__":
    main()
