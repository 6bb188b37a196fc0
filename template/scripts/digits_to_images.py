"""Write scikit-learn's bundled handwritten digits as PNG files, one folder per class, for the
image data module (configs/data/images.yaml): ``<output>/<digit>/<sample>.png``, 1,797 grey
images of 8x8 pixels, offline.

Usage:
    python scripts/digits_to_images.py                    # -> data/images
    python scripts/digits_to_images.py --output data/other
"""

import argparse
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torchvision.io import write_png


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the bundled digits as PNG files in class folders.")
    parser.add_argument("--output", type=Path, default=Path("data/images"), help="the folder to write")
    args = parser.parse_args(argv)
    if args.output.exists() and any(args.output.iterdir()):
        parser.error(f"{args.output} is not empty; remove it or choose another --output")
    digits = load_digits()
    pixels = torch.from_numpy(digits.images * 255 / 16).round().to(torch.uint8)  # 0-16 to 0-255
    for sample, (image, digit) in enumerate(zip(pixels, digits.target, strict=True)):
        folder = args.output / str(digit)
        folder.mkdir(parents=True, exist_ok=True)
        write_png(image[None], str(folder / f"{sample:04d}.png"))
    print(f"wrote {len(pixels)} images into {len(digits.target_names)} class folders under {args.output}")


if __name__ == "__main__":
    main()
