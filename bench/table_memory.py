"""Benchmark: the peak memory of reading and preparing a CSV table, against the file's size.

Writes three CSV files of about ``--mb`` megabytes (ten numeric features, a label of three
classes): ``numeric``; ``with_text``, the same plus a text column of three short categories;
``long_cell``, the same as ``with_text`` with one of its cells 1,000 characters long. For each, a
fresh process imports torch and the generated project's ``FileDataModule``, notes its peak
resident memory (``ru_maxrss``), runs the data module's ``setup("fit")`` (what ``fit`` does to
the data before training: read, check, split, fit the preprocessing, encode the splits), and
notes it again. Prints, per file, its size, the peak over the baseline of an interpreter with
torch imported, and that peak over the file's size.

Run it from a generated project, whose package it imports:

    cd PROJECT && PYTHONPATH=src python /path/to/bench/table_memory.py --package PACKAGE [--mb 100]
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

MEASURE = """
import resource, sys
import torch
from {package}.framework.data.file import FileDataModule
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
FileDataModule(path=sys.argv[1], batch_size=256).setup("fit")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(before * 1024, (after - before) * 1024)
"""


def write_tables(directory: Path, megabytes: float) -> dict[str, Path]:
    """The three CSV files, each of about ``megabytes``."""
    rows = int(megabytes * 1e6 / 118)  # ten features of ten characters, a label and a category
    generator = np.random.default_rng(0)
    features = generator.normal(size=(rows, 10))
    lines = [",".join(f"{value:.6f}" for value in row) for row in features]
    labels = [str(label) for label in generator.integers(0, 3, rows)]
    kinds = [("red", "green", "blue")[i % 3] for i in range(rows)]
    header = [f"x{i}" for i in range(10)]
    files = {
        "numeric": (",".join([*header, "label"]), [f"{line},{label}" for line, label in zip(lines, labels)]),
        "with_text": (
            ",".join([*header, "kind", "label"]),
            [f"{line},{kind},{label}" for line, kind, label in zip(lines, kinds, labels)],
        ),
    }
    long_cell = list(files["with_text"][1])
    long_cell[rows // 2] = f"{lines[rows // 2]},{'a' * 1000},{labels[rows // 2]}"
    files["long_cell"] = (files["with_text"][0], long_cell)
    paths = {}
    for name, (head, body) in files.items():
        paths[name] = directory / f"{name}.csv"
        paths[name].write_text("\n".join([head, *body]) + "\n")
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", required=True)
    parser.add_argument("--mb", type=float, default=100.0, help="the size of each file, in megabytes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        paths = write_tables(Path(directory), args.mb)
        print(f"{'file':10s} {'size MB':>8s} {'baseline MB':>12s} {'peak over baseline MB':>22s} {'ratio':>6s}")
        for name, path in paths.items():
            measured = subprocess.run(
                [sys.executable, "-c", MEASURE.format(package=args.package), str(path)],
                capture_output=True,
                text=True,
                timeout=1800,
            )
            if measured.returncode:
                print(f"{name:10s} failed: {measured.stderr.strip().splitlines()[-1]}")
                continue
            baseline, peak = (int(value) for value in measured.stdout.split()[-2:])
            size = path.stat().st_size
            print(f"{name:10s} {size / 1e6:8.1f} {baseline / 1e6:12.0f} {peak / 1e6:22.0f} {peak / size:6.2f}")


if __name__ == "__main__":
    main()
