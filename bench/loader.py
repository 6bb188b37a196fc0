"""How fast the project's training loader serves batches, by number of worker processes.

Iterates the ``DigitsDataModule`` training loader (the project's default data) for a few epochs
with ``num_workers`` 0, 1 and 2, and, for comparison, a plain ``DataLoader`` over a
``TensorDataset``, which fetches sample by sample and stacks them. Prints microseconds per
batch of the first epoch (which starts the workers) and the median of the following ones.
"""

import argparse
import importlib
import statistics
import time
import warnings

from torch.utils.data import DataLoader, TensorDataset


def time_epochs(loader, epochs: int) -> list[float]:
    times = []
    for epoch in range(epochs):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        started = time.perf_counter()
        batches = sum(1 for _ in loader)
        times.append((time.perf_counter() - started) / batches)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--package", required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    data_module = importlib.import_module(f"{args.package}.data").DigitsDataModule

    print(f"{f'training loader (batch {args.batch_size})':44s} {'first epoch':>12s} {'later epochs':>13s}")
    for workers in (0, 1, 2):
        data = data_module(batch_size=args.batch_size, num_workers=workers)
        data.setup("fit")
        times = time_epochs(data.train_dataloader(), args.epochs)
        print(
            f"{f'project loader, num_workers={workers}':44s} {times[0] * 1e6:9.0f} us "
            f"{statistics.median(times[1:]) * 1e6:10.0f} us"
        )
    data = data_module(batch_size=args.batch_size)
    data.setup("fit")
    plain = DataLoader(TensorDataset(*data.splits["train"].tensors), batch_size=args.batch_size, shuffle=True)
    times = time_epochs(plain, args.epochs)
    print(
        f"{'DataLoader(TensorDataset), sample by sample':44s} {times[0] * 1e6:9.0f} us "
        f"{statistics.median(times[1:]) * 1e6:10.0f} us"
    )


if __name__ == "__main__":
    main()
