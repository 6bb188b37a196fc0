"""Benchmark: LitData shards (framework/data/streaming.py) against memory and against image files.

1. Memory. Writes a CSV file of about ``--mb`` megabytes (100 numeric features, a label of ten
   classes), row by row, never whole. A fresh process converts it to shards
   (``table_to_shards``), another trains one epoch on them (``fit`` with
   configs/data/streaming.yaml). Prints, per step, the file's size, the process's peak resident
   memory (``ru_maxrss``), that of a process that only imports what it does, and the difference
   over the file's size. ``--memory_mb`` runs each in a memory cgroup of that limit (root, and
   cgroup v1's or v2's memory controller): a process that needs more is killed, and the bench
   fails. (An address-space limit, ``prlimit --as``, cannot stand in: importing torch and
   lightning alone reserves about 3.9 GB of address space.)
2. Throughput. The same few hundred digit images (``--images`` per class) as PNG files through
   ``ImageFolderDataModule`` and as shards through ``StreamingDataModule``: the same CNN, batch
   size and epochs, ``--repeats`` times interleaved. Prints each one's fit time (the record's
   ``wall_time_s``: training and validation, start-up excluded) and the ratio.

Run it from a generated project, whose package it imports:

    cd PROJECT && PYTHONPATH=src python /path/to/bench/streaming.py --package PACKAGE [--mb 400]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BASELINE = "import torch, lightning, litdata, pandas, sklearn, {package}.framework.cli"
CONVERT = (
    "from pathlib import Path; from {package}.framework.data.streaming import table_to_shards; "
    "table_to_shards(Path({csv!r}), Path({output!r}))"
)
FEATURES, CLASSES = 100, 10


def write_csv(path: Path, megabytes: float) -> int:
    """A CSV file of about ``megabytes``, written a block of rows at a time; its number of rows."""
    rows = int(megabytes * 1e6 / (FEATURES * 10))
    generator = np.random.default_rng(0)
    with path.open("w") as file:
        file.write(",".join([*(f"x{i}" for i in range(FEATURES)), "label"]) + "\n")
        for start in range(0, rows, 10_000):
            count = min(10_000, rows - start)
            block = generator.normal(size=(count, FEATURES))
            labels = generator.integers(0, CLASSES, count)
            np.savetxt(
                file, np.column_stack([block, labels]), fmt=["%.6f"] * FEATURES + ["%d"], delimiter=","
            )
    return rows


def memory_cgroup(megabytes: int) -> Path:
    """A new memory cgroup limited to ``megabytes`` (its page cache counted too); the file to
    write a process's id into to put it there."""
    controllers = Path("/sys/fs/cgroup/cgroup.controllers")
    name = f"bench-streaming-{os.getpid()}"
    if controllers.exists() and "memory" in controllers.read_text().split():
        group, limit = Path("/sys/fs/cgroup") / name, "memory.max"
    else:
        group, limit = Path("/sys/fs/cgroup/memory") / name, "memory.limit_in_bytes"
    group.mkdir()
    (group / limit).write_text(str(megabytes * 2**20))
    return group / "cgroup.procs"


def peak_mb(command: list[str], cgroup: Path | None, cwd: Path | None = None) -> float:
    """The peak resident memory of ``command``'s process, in MB; fails on a non-zero exit (the
    cgroup's limit kills it)."""

    def enter() -> None:
        if cgroup:
            cgroup.write_text(str(os.getpid()))

    process = subprocess.Popen(
        command, cwd=cwd, preexec_fn=enter, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(process.pid, 0)
    if status:
        sys.exit(f"{' '.join(command)} failed (status {status}):\n{process.stderr.read().decode()[-3000:]}")
    return usage.ru_maxrss / 1024


def memory(package: str, project: Path, directory: Path, megabytes: float, memory_mb: int | None) -> None:
    csv, shards = directory / "table.csv", directory / "shards"
    cgroup = memory_cgroup(memory_mb) if memory_mb else None
    rows = write_csv(csv, megabytes)
    size = csv.stat().st_size / 1e6
    baseline = peak_mb([sys.executable, "-c", BASELINE.format(package=package)], cgroup)
    started = time.perf_counter()
    convert = peak_mb(
        [sys.executable, "-c", CONVERT.format(package=package, csv=str(csv), output=str(shards))], cgroup
    )
    convert_s = time.perf_counter() - started
    config = project / "configs" / "data" / "streaming.yaml"
    fit = [
        sys.executable, "-m", package, "fit", "--config", str(config),
        f"--data.init_args.input_dir={shards}", "--data.init_args.batch_size=256",
        "--data.init_args.num_workers=1", "--trainer.max_epochs=1", "--trainer.logger=false",
        "--run_name=bench-streaming",
    ]  # fmt: skip
    started = time.perf_counter()
    train = peak_mb(fit, cgroup, cwd=directory)
    train_s = time.perf_counter() - started
    limit = f", each process in a memory cgroup of {memory_mb} MB" if memory_mb else ""
    print(f"CSV {size:.0f} MB, {rows:,} rows of {FEATURES} features{limit}")
    print(f"  {'imports only':14} peak {baseline:6.0f} MB")
    for step, peak, seconds in (("convert", convert, convert_s), ("train 1 epoch", train, train_s)):
        extra = peak - baseline
        share = f"{extra:5.0f} MB over imports = {extra / size:.2f} x the file"
        print(f"  {step:14} peak {peak:6.0f} MB, {share}, {seconds:.0f} s")


def throughput(
    package: str, project: Path, directory: Path, per_class: int, repeats: int, epochs: int
) -> None:
    images = directory / "images"
    scripts = project / "scripts"
    run = [sys.executable, str(scripts / "digits_to_images.py"), "--output", str(directory / "all")]
    subprocess.run(run, check=True, stdout=subprocess.DEVNULL)
    for folder in sorted((directory / "all").iterdir()):
        (images / folder.name).mkdir(parents=True)
        for file in sorted(folder.iterdir())[:per_class]:
            shutil.copy(file, images / folder.name)
    shards = directory / "image-shards"
    run = [sys.executable, str(scripts / "to_shards.py"), "--images", str(images), "--output", str(shards)]
    subprocess.run(run, check=True, stdout=subprocess.DEVNULL)
    common = [
        "--config", str(project / "configs" / "model" / "cnn.yaml"), f"--trainer.max_epochs={epochs}",
        "--trainer.logger=false", "--data.init_args.batch_size=32", "--data.init_args.num_workers=1",
    ]  # fmt: skip
    configs = project / "configs" / "data"
    sources = {
        "ImageFolderDataModule": [
            "--config",
            str(configs / "images.yaml"),
            f"--data.init_args.root={images}",
        ],
        "StreamingDataModule": [
            "--config",
            str(configs / "streaming.yaml"),
            f"--data.init_args.input_dir={shards}",
        ],
    }
    times = {name: [] for name in sources}
    for repeat in range(repeats):
        for name, data in sources.items():
            cwd = directory / f"{name}-{repeat}"
            cwd.mkdir()
            config = (
                project / "configs" / "data" / f"{'images' if name.startswith('Image') else 'streaming'}.yaml"
            )
            command = [
                sys.executable,
                "-m",
                package,
                "fit",
                "--config",
                str(config),
                *data,
                *common,
                "--run_name=bench",
            ]
            subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            record = json.loads((cwd / "experiments.jsonl").read_text().splitlines()[-1])
            times[name].append(record["wall_time_s"])
    count = sum(1 for _ in images.glob("*/*.png"))
    print(f"{count} images, CNN, batch 32, 1 worker, {epochs} epochs, {repeats} interleaved rounds:")
    for name, seconds in times.items():
        print(f"  {name:22} median fit {np.median(seconds):.2f} s  {[round(s, 2) for s in seconds]}")
    ratio = np.median(times["ImageFolderDataModule"]) / np.median(times["StreamingDataModule"])
    print(f"  streaming / image folder throughput: {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--package", required=True, help="the generated project's package name")
    parser.add_argument("--mb", type=float, default=400, help="the size of the CSV file, in MB")
    parser.add_argument("--memory_mb", type=int, help="the limit of a memory cgroup for each process")
    parser.add_argument("--images", type=int, default=40, help="images per class for the throughput test")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    project = Path.cwd()
    with tempfile.TemporaryDirectory() as temporary:
        memory(args.package, project, Path(temporary), args.mb, args.memory_mb)
    with tempfile.TemporaryDirectory() as temporary:
        throughput(args.package, project, Path(temporary), args.images, args.repeats, args.epochs)


if __name__ == "__main__":
    main()
