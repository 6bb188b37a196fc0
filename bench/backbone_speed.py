"""How fast the project's backbone (framework/models/backbone.py) trains on the CPU at 224 pixels, and where
the time of one image goes.

Writes once, and keeps, JPEG photos of a usual photo's size (500 x 375: crops of scikit-learn's
two bundled sample photos at random places, in 4 classes). Then, with the generated project's
``ImageFolderDataModule`` (224 pixels, its augmentation for photos: random resized crop of 8-100%
of the area, left-right flip; the ImageNet statistics) and ``Backbone`` (timm's resnet18 from random
weights):

- training images per second, loader and step together (cross-entropy, AdamW, clipping by norm),
  with ``num_workers`` 0, 1 and 2, over the steps after the first ``--skip`` (which start the
  workers);
- the time of one image in each stage, in the main process, one at a time: reading and decoding
  the JPEG file (``read_image``) and the training transform, on one torch thread as a loader
  worker runs them, the transform again on the process's threads as ``num_workers=0`` runs it;
  and the image's share of a batch's forward, backward and optimizer step.

    python bench/backbone_speed.py [--steps 6] [--batch-size 32] [--threads 0]
        [--project DIR --package NAME]

Without ``--project`` it generates a project from this template, as ``bench/run.py`` does.
"""

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from images import batches, cached, step
from run import PACKAGE, generate
from sklearn.datasets import load_sample_images
from torchvision.io import write_jpeg

WIDTH, HEIGHT = 500, 375
CLASSES = 4


def write_photos(folder: Path, count: int) -> None:
    """``count`` JPEG photos of ``WIDTH`` x ``HEIGHT`` in ``CLASSES`` class folders: crops of a
    sample photo (640 x 427) at random places, some flipped."""
    rng = np.random.default_rng(0)
    photos = [torch.tensor(image).permute(2, 0, 1).contiguous() for image in load_sample_images().images]
    for index in range(count):
        photo = photos[index % len(photos)]
        top = int(rng.integers(0, photo.shape[1] - HEIGHT + 1))
        left = int(rng.integers(0, photo.shape[2] - WIDTH + 1))
        image = photo[:, top : top + HEIGHT, left : left + WIDTH]
        if rng.random() < 0.5:
            image = image.flip(-1)
        class_folder = folder / f"class_{index % CLASSES}"
        class_folder.mkdir(parents=True, exist_ok=True)
        write_jpeg(image.contiguous(), str(class_folder / f"{index:05d}.jpg"), quality=90)


def training_rate(loader, network, steps: int, skip: int) -> tuple[float, float]:
    """Training images per second over the steps after the first ``skip``, and the share of that
    time spent waiting for the loader."""
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-3, weight_decay=0.01)
    network.train()
    served = batches(loader)
    images, waited = 0, 0.0
    for index in range(skip + steps):
        if index == skip:
            started, images, waited = time.perf_counter(), 0, 0.0
        fetching = time.perf_counter()
        inputs, labels = next(served)
        waited += time.perf_counter() - fetching
        step(network, optimizer, inputs, labels)
        images += len(labels)
    elapsed = time.perf_counter() - started
    served.close()  # ends the loader's workers
    return images / elapsed, waited / elapsed


def per_image(module, network, batch_size: int, read_image) -> dict[str, float]:
    """Milliseconds per image in each stage, measured in this process one stage at a time: decoding
    and augmenting on one torch thread, as a loader worker does them, and the augmentation again on
    this process's threads, as ``num_workers=0`` does it."""
    files = module.files["train"][:batch_size]
    transform = module.transform(train=True)
    threads = torch.get_num_threads()
    timings = {}
    for name, count in (("augment", 1), (f"augment on {threads} threads (num_workers 0)", threads)):
        torch.set_num_threads(count)
        transform(read_image(files[0]))  # the first call sets up the operations
        started = time.perf_counter()
        decoded = [read_image(path) for path in files]
        timings.setdefault("decode", time.perf_counter() - started)
        started = time.perf_counter()
        inputs = [transform(image) for image in decoded]
        timings[name] = time.perf_counter() - started
    torch.set_num_threads(threads)
    batch = torch.stack(inputs)
    labels = torch.zeros(batch_size, dtype=torch.long)
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-3, weight_decay=0.01)
    network.train()
    step(network, optimizer, batch, labels)  # the first step allocates
    started = time.perf_counter()
    for _ in range(2):
        step(network, optimizer, batch, labels)
    timings["forward, backward and step"] = (time.perf_counter() - started) / 2
    return {name: 1000 * seconds / batch_size for name, seconds in timings.items()}


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
    parser.add_argument("--photos", type=int, default=256, help="JPEG photos to write (70%% train)")
    parser.add_argument("--network", default="resnet18", help="timm's name of the backbone")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6, help="timed training steps per worker count")
    parser.add_argument("--skip", type=int, default=1, help="untimed training steps first")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--project", type=Path, help="a generated project (default: generate one)")
    parser.add_argument("--package", default=PACKAGE, help="the project's package name")
    parser.add_argument("--template", default="HEAD", help="the template's git ref, to generate the project")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    workdir = None
    if args.project is None:
        workdir = Path(tempfile.mkdtemp(prefix="bench-backbone-"))
        args.project = generate(workdir, args.template)
    sys.path.insert(0, str(args.project / "src"))
    images = importlib.import_module(f"{args.package}.framework.data.images")
    backbone = importlib.import_module(f"{args.package}.framework.models.backbone")

    args.images.mkdir(parents=True, exist_ok=True)
    name = f"photos-{WIDTH}x{HEIGHT}-{args.photos}"
    photos = cached(args.images / name, lambda path: write_photos(path, args.photos))
    # The network's own statistics and interpolation, as the command line gives the data module.
    settings = backbone.data_config(args.network) | {
        "image_size": 224,
        "crop_scale": (0.08, 1.0),
        "flip": True,
    }

    def data_module(workers: int):
        module = images.ImageFolderDataModule(
            str(photos), batch_size=args.batch_size, num_workers=workers, **settings
        )
        module.setup("fit")
        return module

    module = data_module(0)
    network = backbone.Backbone(args.network, num_classes=module.num_classes, channels_last=False)
    print(
        f"{args.network} from random weights at 224, batch {args.batch_size}; {args.photos} JPEG photos of "
        f"{WIDTH} x {HEIGHT} in {photos}; {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )

    stages = per_image(module, network, args.batch_size, images.read_image)
    # One image's path in training with workers: decoded and augmented in a worker, then computed.
    total = sum(ms for stage, ms in stages.items() if "num_workers" not in stage)
    print("\nwhere one training image's time goes, measured one stage at a time in the main process:")
    print("| stage | ms per image | share |")
    print("|---|---:|---:|")
    for stage, ms in stages.items():
        print(f"| {stage} | {ms:.1f} | {ms / total:.0%} |")
    print(f"| decode, augment (1 thread), compute | {total:.1f} | 100% |", flush=True)

    print(f"\ntraining, loader and step together ({args.steps} steps after {args.skip}):")
    print("| num_workers | images/s | waiting for data | vs 0 workers |")
    print("|---:|---:|---:|---:|")
    rates = {}
    for workers in (0, 1, 2):
        rate, waiting = training_rate(data_module(workers).train_dataloader(), network, args.steps, args.skip)
        rates[workers] = rate
        print(f"| {workers} | {rate:.1f} | {waiting:.0%} | {rate / rates[0]:.2f} |", flush=True)
    print(f"\none image's stages in sequence: {1000 / total:.1f} images/s")
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
