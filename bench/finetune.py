"""Evidence that fine-tuning helps, offline: the generated project's ``tests/template/test_finetuning.py``
experiment over more seeds, printed as the markdown table of docs/finetuning.md.

A timm ``test_resnet`` (0.37M parameters) is pretrained once on the bundled digits 0-4, as PNG
files, and its weights saved to a local file; then, for each seed, a draw of 10 training images of
each of the digits 5-9 is fine-tuned three ways, with the same data, epochs and seed:

- ``pretrained``: from the file, every weight training at the same learning rate;
- ``recipe``: from the file with configs/model/backbone.yaml's fine-tuning settings (the head alone
  for ``--freeze-epochs``, then everything with the backbone at ``--backbone-lr-scale`` of the
  learning rate);
- ``random``: from random weights, as ``pretrained`` otherwise.

Each is scored on the same held-out images of 5-9 (about 820). The settings are the test's own
(``PRETRAIN``, ``FINE_TUNE``, ``SHOTS``, ...), imported from it, so the table and the test measure
one experiment.

    python bench/finetune.py [--seeds 5] [--threads 1] [--project DIR --package NAME]

Without ``--project`` it generates a project from this template, as ``bench/run.py`` does.
"""

import argparse
import importlib
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from run import PACKAGE, generate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 to N-1 (the test runs 0-2)")
    parser.add_argument("--freeze-epochs", type=int, default=1, help="the recipe's epochs of the head alone")
    parser.add_argument("--backbone-lr-scale", type=float, default=0.1, help="the recipe's backbone rate")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--project", type=Path, help="a generated project (default: generate one)")
    parser.add_argument("--package", default=PACKAGE, help="the project's package name")
    parser.add_argument("--template", default="HEAD", help="the template's git ref, to generate the project")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)

    workdir = Path(tempfile.mkdtemp(prefix="bench-finetune-"))
    if args.project is None:
        args.project = generate(workdir, args.template)
    sys.path[:0] = [str(args.project / "src"), str(args.project / "tests")]
    experiment = importlib.import_module("test_finetuning")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)

    started = time.perf_counter()
    weights, source_accuracy = experiment.pretrain(workdir)
    print(
        f"pretrained {experiment.NETWORK} on the digits {experiment.SOURCE} in "
        f"{time.perf_counter() - started:.0f} s: test accuracy {source_accuracy:.3f}; fine-tuning "
        f"{experiment.FINE_TUNE} on {experiment.SHOTS} images of each of {experiment.TARGET}, "
        f"recipe freeze_epochs={args.freeze_epochs} backbone_lr_scale={args.backbone_lr_scale}; "
        f"{os.cpu_count()} CPUs, torch threads {args.threads}, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    recipe = {"freeze_epochs": args.freeze_epochs, "backbone_lr_scale": args.backbone_lr_scale}
    rows = []
    print("\n| seed | pretrained | recipe | random | pretrained - random | recipe - random |")
    print("|---:|---:|---:|---:|---:|---:|", flush=True)
    for seed in range(args.seeds):
        target = experiment.write_target(workdir / f"target-{seed}", seed)
        _, pretrained = experiment.train(target, str(weights), seed, experiment.FINE_TUNE)
        _, tuned = experiment.train(target, str(weights), seed, experiment.FINE_TUNE, **recipe)
        _, random = experiment.train(target, None, seed, experiment.FINE_TUNE)
        shutil.rmtree(target)
        rows.append((pretrained, tuned, random, pretrained - random, tuned - random))
        print(f"| {seed} | " + " | ".join(f"{value:.3f}" for value in rows[-1]) + " |", flush=True)
    columns = list(zip(*rows, strict=True))
    print("| mean | " + " | ".join(f"{statistics.mean(column):.3f}" for column in columns) + " |")
    print("| min | " + " | ".join(f"{min(column):.3f}" for column in columns) + " |")
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
