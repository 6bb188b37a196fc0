"""How fast the project's image data module serves batches, and whether a training step waits for them.

Writes once, and keeps, two folders of images in class folders: 224 x 224 JPEG photos (random
square crops of scikit-learn's two bundled sample photos, resized, in 10 classes) and the bundled
digits as 8 x 8 PNG files (the project's ``scripts/digits_to_images.py``, what its demo trains on).
Then, with the generated project's ``ImageFolderDataModule``, on two setups: the photos at
``image_size`` 224 with the module's augmentation for photos (random resized crop of 8-100% of the
area, left-right flip), and the digits at 16 with ``configs/data/images.yaml``'s settings:

- the training loader alone: images per second with ``num_workers`` 0, 1 and 2 (persistent
  workers, as the module makes them), over the epochs after a first one that starts the workers;
- the loader feeding a training step, with the module's default number of workers (and with none,
  for the digits): the project's ``ConvNet`` with cross-entropy, AdamW and gradient clipping by norm,
  as ``Classifier`` trains it by default. Time in ``next(iterator)`` is waiting for data, time in
  the step is computing; the first steps, which start the workers, are left out.

    python bench/images.py [--images DIR] [--threads 1] [--steps-224 3] [--steps-16 60]
        [--project DIR --package NAME]

Without ``--project`` it generates a project from this template, as ``bench/run.py`` does.
"""

import argparse
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import yaml
from run import PACKAGE, generate
from sklearn.datasets import load_sample_images
from torch.nn import functional
from torch.nn.utils import clip_grad_norm_
from torchvision.io import write_jpeg
from torchvision.transforms.v2.functional import resize

PHOTO_SIZE = 224
CLASSES = 10


def write_photos(folder: Path, count: int) -> None:
    """``count`` JPEG photos of 224 x 224 in ``CLASSES`` class folders: square crops of 22-100% of
    a sample photo's height, at random places, resized."""
    rng = np.random.default_rng(0)
    photos = [torch.tensor(image).permute(2, 0, 1).contiguous() for image in load_sample_images().images]
    for index in range(count):
        photo = photos[index % len(photos)]
        height, width = photo.shape[1:]
        side = int(rng.integers(96, height + 1))
        top, left = int(rng.integers(0, height - side + 1)), int(rng.integers(0, width - side + 1))
        image = resize(
            photo[:, top : top + side, left : left + side], [PHOTO_SIZE, PHOTO_SIZE], antialias=True
        )
        class_folder = folder / f"class_{index % CLASSES}"
        class_folder.mkdir(parents=True, exist_ok=True)
        write_jpeg(image, str(class_folder / f"{index:05d}.jpg"), quality=90)


def cached(folder: Path, write) -> Path:
    """``folder``, written by ``write(path)`` into a temporary folder renamed when complete, unless it
    exists."""
    if not folder.is_dir():
        partial = folder.with_name(folder.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        write(partial)
        os.replace(partial, folder)
    return folder


def images_per_second(loader, epochs: int) -> float:
    """Training images served per second, median over the epochs after the first."""
    rates = []
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        started = time.perf_counter()
        images = sum(len(labels) for _, labels in loader)
        rates.append(images / (time.perf_counter() - started))
    return statistics.median(rates[1:])


def batches(loader):
    """The loader's batches without end, as training takes them: a new epoch, set on its sampler,
    whenever the last runs out."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def step(network, optimizer, inputs, labels) -> None:
    """One training step: cross-entropy, clipping by norm, the optimizer's step."""
    loss = functional.cross_entropy(network(inputs), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    clip_grad_norm_(network.parameters(), 1.0)
    optimizer.step()


def wait_and_compute(loader, network, steps: int, skip: int) -> tuple[list[float], list[float], float]:
    """Seconds spent waiting for the next batch and in the training step, for each step after the
    first ``skip``; and the first step's wait. A new epoch starts when the loader runs out, as in
    training: its first batch's wait is counted."""
    optimizer = torch.optim.AdamW(network.parameters(), lr=0.003, weight_decay=0.01)
    network.train()
    served = batches(loader)
    waits, computes = [], []
    while len(waits) < steps:
        started = time.perf_counter()
        inputs, labels = next(served)
        fetched = time.perf_counter()
        step(network, optimizer, inputs, labels)
        waits.append(fetched - started)
        computes.append(time.perf_counter() - fetched)
    served.close()  # ends the loader's workers
    return waits[skip:], computes[skip:], waits[0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--images",
        type=Path,
        default=Path(tempfile.gettempdir()) / "copier-lightning-bench-images",
        help="where the images are written once and kept",
    )
    parser.add_argument("--photos", type=int, default=1280, help="JPEG photos to write (70%% train)")
    parser.add_argument(
        "--epochs", type=int, default=3, help="loader epochs per worker count, the first not timed"
    )
    parser.add_argument("--steps-224", type=int, default=3, help="training steps at 224, the first not timed")
    parser.add_argument(
        "--steps-16", type=int, default=60, help="training steps at 16, the first 5 not timed"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the training step")
    parser.add_argument("--project", type=Path, help="a generated project (default: generate one)")
    parser.add_argument("--package", default=PACKAGE, help="the project's package name")
    parser.add_argument("--template", default="HEAD", help="the template's git ref, to generate the project")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    workdir = None
    if args.project is None:
        workdir = Path(tempfile.mkdtemp(prefix="bench-images-"))
        args.project = generate(workdir, args.template)
    sys.path.insert(0, str(args.project / "src"))
    data_package = importlib.import_module(f"{args.package}.data")
    network_class = importlib.import_module(f"{args.package}.models.convnet").ConvNet
    default_workers = data_package.images.default_workers(1)

    args.images.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    photos = cached(args.images / f"photos-{args.photos}", lambda path: write_photos(path, args.photos))
    digits_script = args.project / "scripts" / "digits_to_images.py"
    digits = cached(
        args.images / "digits",
        lambda path: subprocess.run(
            [sys.executable, str(digits_script), f"--output={path}"], check=True, stdout=subprocess.DEVNULL
        ),
    )
    digits_config = yaml.safe_load((args.project / "configs" / "data" / "images.yaml").read_text())
    # The preset's settings as the GUIDE trains the digits: at 16 pixels, unflipped; the workers swept.
    digits_settings = digits_config["data"]["init_args"] | {"root": str(digits), "image_size": 16}
    digits_settings |= {"flip": False}
    digits_settings.pop("num_workers")
    setups = {
        "photos at 224": {"root": str(photos), "image_size": 224, "crop_scale": (0.08, 1.0), "flip": True},
        "digits at 16": digits_settings,
    }
    print(
        f"images in {args.images} ({time.perf_counter() - started:.1f} s to write or find): {args.photos} "
        f"JPEG photos of {PHOTO_SIZE} x {PHOTO_SIZE} in {CLASSES} classes, and 1797 digits as 8 x 8 PNG; "
        f"{os.cpu_count()} CPUs, default num_workers {default_workers}, torch threads {args.threads}, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )

    def data_module(setup: str, workers: int | None):
        module = data_package.ImageFolderDataModule(**setups[setup], num_workers=workers)
        module.setup("fit")
        return module

    print(f"\ntraining loader alone, images/s (median of {args.epochs - 1} epochs after the first):")
    print(
        f"{'setup':16s} {'batch':>5s} {'train images':>12s} "
        f"{'workers 0':>10s} {'workers 1':>10s} {'workers 2':>10s}"
    )
    for setup in setups:
        rates = []
        for workers in (0, 1, 2):
            module = data_module(setup, workers)
            rates.append(images_per_second(module.train_dataloader(), args.epochs))
        print(
            f"{setup:16s} {module.batch_size:5d} {len(module.files['train']):12d} "
            + " ".join(f"{rate:10.0f}" for rate in rates),
            flush=True,
        )

    print(
        "\ntraining step (CNN, AdamW, clipping) on the loader's batches, time per step: "
        "waiting in next(), computing"
    )
    print(
        f"{'setup':16s} {'workers':>7s} {'steps':>5s} {'first wait s':>12s} {'wait ms':>9s} "
        f"{'median wait':>11s} {'step ms':>9s} {'total ms':>9s} {'wait fraction':>13s}"
    )
    runs = [("photos at 224", default_workers, args.steps_224, 1)]
    runs += [("digits at 16", default_workers, args.steps_16, 5), ("digits at 16", 0, args.steps_16, 5)]
    for setup, workers, steps, skip in runs:
        module = data_module(setup, workers)
        network = network_class(num_classes=module.num_classes)
        waits, computes, first_wait = wait_and_compute(module.train_dataloader(), network, steps, skip)
        total = sum(waits) + sum(computes)
        print(
            f"{setup:16s} {workers:7d} {len(waits):5d} {first_wait:12.2f} "
            f"{1000 * statistics.mean(waits):9.2f} {1000 * statistics.median(waits):11.2f} "
            f"{1000 * statistics.mean(computes):9.1f} "
            f"{1000 * total / len(waits):9.1f} {sum(waits) / total:13.3f}",
            flush=True,
        )
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
