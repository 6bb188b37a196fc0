"""Benchmark: which epoch the best checkpoint should keep, on small classification tables.

On a small validation split ``val/acc`` takes few values and ties across many epochs, so the rule
that picks the best epoch matters. This trains a generated classification project with its
default config (30 epochs, the default model) on three of scikit-learn's bundled tables, over
several seeds, keeps every epoch's checkpoint, and evaluates each on the validation and test
splits. Then it reports, per table and per rule, the test accuracy and loss of the epoch the rule
picks (mean and worst over the seeds):

- ``acc, first tie``: the highest val/acc, the earliest of tied epochs (Lightning's
  ``ModelCheckpoint`` with ``monitor: val/acc``, which replaces only on strict improvement);
- ``acc, latest tie``: the highest val/acc, the latest of tied epochs;
- ``acc, then loss``: the highest val/acc, tied epochs by the lowest val/loss;
- ``loss``: the lowest val/loss;
- ``last``: the last epoch (``last.ckpt``).

The tables, written as CSV files and read through ``configs/data/file.yaml`` as the project's
tests/template/test_own_data.py writes them (a column of text, the labels by name or number): ``digits``
(the default data module, 1,797 samples, 270 for validation), ``breast_cancer`` (569, 86) and
``wine`` (178, 27). Run ``i`` sets ``seed_everything`` to 42 + i and ``data.init_args.split_seed``
to i, so run 0 is the default config itself.

Each fit runs as ``python -m <package> fit`` with ``--checkpoint.save_top_k=-1`` (every epoch
kept), the loggers and progress bar off, in a scratch directory; each run's result is appended to
``--out`` as one JSON line, and a run already there is not trained again. The fit's own choice
(``best_epoch`` of its line in experiments.jsonl) is printed beside the rules, so the table also
shows which rule the project applies. About 35 s a run on two cores, 15 runs by default.

    python bench/best_checkpoint.py PROJECT [--seeds 5] [--tables digits,breast_cancer,wine]
        [--out best_checkpoint.jsonl]

PROJECT is a project generated from this template with the classification task, e.g.
``copier copy --defaults --vcs-ref=HEAD --data project_name=probe . /tmp/probe``.
"""

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer, load_wine
from torch.nn import functional

TABLES = ("digits", "breast_cancer", "wine")
RULES = ("acc, first tie", "acc, latest tie", "acc, then loss", "loss", "last")


def package_of(project: Path) -> str:
    [package] = [path.parent.name for path in (project / "src").glob("*/__main__.py")]
    return package


def terciles(values: np.ndarray, names: list[str]) -> list[str]:
    """Each value's third of the data, by name: a column of text (as tests/template/test_own_data.py)."""
    return [names[i] for i in np.searchsorted(np.quantile(values, [1 / 3, 2 / 3]), values)]


def write_table(name: str, path: Path) -> str:
    """Write the table ``name`` as a CSV file; the name of its label column."""
    if name == "breast_cancer":
        data = load_breast_cancer()
        header = [*(feature.replace(" ", "_") for feature in data.feature_names), "size", "diagnosis"]
        extra = terciles(data.data[:, 0], ["small", "medium", "large"])
        labels = [str(data.target_names[target]) for target in data.target]
    else:
        data = load_wine()
        header = [*data.feature_names, "strength", "cultivar"]
        extra = terciles(data.data[:, 0], ["light", "medium", "strong"])
        labels = [str(target + 1) for target in data.target]
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        rows = zip(data.data.tolist(), extra, labels, strict=True)
        writer.writerows([*map(str, features), text, label] for features, text, label in rows)
    return header[-1]


def data_args(project: Path, table: str, scratch: Path) -> list[str]:
    if table == "digits":
        return []
    path = scratch / f"{table}.csv"
    label = write_table(table, path)
    config = project / "configs" / "data" / "file.yaml"
    return [f"--config={config}", f"--data.init_args.path={path}", f"--data.init_args.label_column={label}"]


def fit(project: Path, package: str, args: list[str], run_name: str, cwd: Path) -> dict:
    """Train with every epoch's checkpoint kept; the fit's line of experiments.jsonl."""
    command = [sys.executable, "-m", package, "fit", *args, f"--run_name={run_name}"]
    command += ["--checkpoint.save_top_k=-1", "--trainer.logger=false", "--trainer.enable_progress_bar=false"]
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "WANDB_MODE": "disabled"}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    lines = [json.loads(line) for line in (cwd / "experiments.jsonl").read_text().splitlines()]
    return [line for line in lines if (line["stage"], line["run_name"]) == ("fit", run_name)][-1]


@torch.inference_mode()
def evaluate(model, loader) -> tuple[float, float]:
    """Accuracy and mean cross-entropy over the samples of ``loader``."""
    correct, loss, count = 0, 0.0, 0
    for x, y in loader:
        logits = model(x)
        correct += int((logits.argmax(dim=1) == y).sum())
        loss += float(functional.cross_entropy(logits, y, reduction="sum"))
        count += len(y)
    return correct / count, loss / count


def evaluate_epochs(package: str, args: list[str], run_dir: Path) -> tuple[list[dict], int]:
    """Every epoch's checkpoint of the run on its validation and test splits, in this process;
    and the number of validation samples."""
    cli_module = __import__(f"{package}.framework.cli", fromlist=["main"])
    utils = __import__(f"{package}.framework.runs.checkpoints", fromlist=["load_weights", "read_checkpoint"])
    cli = cli_module.main([*args, "--trainer.logger=false"], run=False)
    model, data = cli.model, cli.datamodule
    data.setup("fit")
    model.eval()
    epochs = []
    for path in sorted(run_dir.glob("best-epoch=*.ckpt")):
        checkpoint = utils.read_checkpoint(path)
        model.preprocess.restore(checkpoint["preprocessing"])
        utils.load_weights(model, path)
        val_acc, val_loss = evaluate(model, data.val_dataloader())
        test_acc, test_loss = evaluate(model, data.test_dataloader())
        # The monitored value the fit logged at this epoch: the same weights give it back here.
        states = checkpoint["callbacks"].items()
        [(monitor, logged)] = [
            (state["monitor"], float(state["current_score"]))
            for key, state in states
            if key.startswith("ModelCheckpoint")
        ]
        here = {"val/acc": val_acc, "val/loss": val_loss}.get(monitor, logged)
        if abs(logged - here) > 1e-6 * max(1.0, abs(here)):
            sys.exit(f"{path}: {monitor} {here} evaluated here, {logged} logged by the fit")
        epoch = {"epoch": checkpoint["epoch"], "val_acc": val_acc, "val_loss": val_loss}
        epochs.append(epoch | {"test_acc": test_acc, "test_loss": test_loss})
    return epochs, len(data.splits["val"])


def pick(rule: str, epochs: list[dict]) -> dict:
    """The epoch a rule keeps, from the epochs' validation metrics in order."""
    if rule == "last":
        return epochs[-1]
    if rule == "loss":
        return min(epochs, key=lambda e: e["val_loss"])
    best = max(e["val_acc"] for e in epochs)
    tied = [e for e in epochs if e["val_acc"] == best]
    if rule == "acc, first tie":
        return tied[0]
    if rule == "acc, latest tie":
        return tied[-1]
    return min(tied, key=lambda e: e["val_loss"])


def table_rows(results: list[dict]) -> list[str]:
    """A Markdown table: per table and rule, test accuracy and loss over the seeds, and how often
    the rule's epoch is the fit's own best checkpoint."""
    lines = [
        "| table (val samples) | rule | test acc mean | test acc min | test loss mean | test loss max "
        "| epoch mean | = fit's best |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for table in TABLES:
        runs = [result for result in results if result["table"] == table]
        if not runs:
            continue
        for rule in RULES:
            picked = [pick(rule, run["epochs"]) for run in runs]
            acc = [p["test_acc"] for p in picked]
            loss = [p["test_loss"] for p in picked]
            same = sum(p["epoch"] == run["fit_best_epoch"] for p, run in zip(picked, runs, strict=True))
            lines.append(
                f"| {table} ({runs[0]['val_samples']}) | {rule} "
                f"| {statistics.mean(acc):.4f} | {min(acc):.4f} "
                f"| {statistics.mean(loss):.4f} | {max(loss):.4f} "
                f"| {statistics.mean(p['epoch'] for p in picked):.1f} | {same}/{len(runs)} |"
            )
    return lines


def measure(project: Path, package: str, table: str, i: int, scratch: Path) -> dict:
    """Run ``i`` on ``table``: its fit's choice and every epoch's metrics."""
    seeds = [f"--seed_everything={42 + i}", f"--data.init_args.split_seed={i}"]
    args = [*data_args(project, table, scratch), *seeds]
    record = fit(project, package, args, f"{table}-{i}", scratch)
    run_dir = scratch / "checkpoints" / f"{table}-{i}"
    os.chdir(scratch)  # where the fit ran: the CLI resolves the run's paths from there
    epochs, val_samples = evaluate_epochs(package, args, run_dir)
    shutil.rmtree(run_dir)
    return {
        **{"table": table, "run": i, "seed": 42 + i, "split_seed": i, "val_samples": val_samples},
        **{"monitor": record["monitor"], "fit_best_epoch": record["best_epoch"], "epochs": epochs},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("project", type=Path, help="a generated classification project")
    parser.add_argument("--seeds", type=int, default=5, help="runs per table (run i: seed 42 + i, split i)")
    parser.add_argument("--tables", default=",".join(TABLES))
    parser.add_argument("--out", type=Path, default=Path("best_checkpoint.jsonl"))
    options = parser.parse_args()
    sys.argv[1:] = []  # the project's CLI, built in this process, reads its own arguments
    project, out = options.project.resolve(), options.out.resolve()
    package = package_of(project)
    sys.path.insert(0, str(project / "src"))
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.is_file() else []
    with tempfile.TemporaryDirectory(prefix="best-checkpoint-") as scratch:
        for table in options.tables.split(","):
            for i in range(options.seeds):
                if any((result["table"], result["run"]) == (table, i) for result in done):
                    continue
                started = time.perf_counter()
                done.append(measure(project, package, table, i, Path(scratch)))
                with out.open("a") as file:
                    file.write(json.dumps(done[-1]) + "\n")
                print(f"{table} run {i}: {time.perf_counter() - started:.0f} s", flush=True)
    print("\n".join(table_rows(done)))


if __name__ == "__main__":
    main()
