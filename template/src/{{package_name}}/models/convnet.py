"""A small convolutional network for images (see framework/data/images.py)."""

from collections.abc import Sequence

from torch import Tensor, nn


class ConvNet(nn.Module):
    """Stages of two 3x3 convolutions with batch norm and ReLU, each stage but the last followed
    by 2x2 max pooling; then global average pooling, dropout and a linear layer. Any image size
    works. The command line sets ``num_classes`` from the data unless given.
    """

    def __init__(
        self,
        num_classes: int | None = None,
        channels: Sequence[int] = (32, 64, 128),
        in_channels: int = 3,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if num_classes is None:
            raise ValueError("network: give num_classes (the CLI takes it from the data)")
        if min(in_channels, *channels) < 1:
            sizes = f"{in_channels} and {list(channels)}"
            raise ValueError(f"network.in_channels and channels must be positive, got {sizes}")
        layers: list[nn.Module] = []
        width = in_channels
        for stage, out in enumerate(channels):
            for _ in range(2):
                layers += [nn.Conv2d(width, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
                width = out
            if stage < len(channels) - 1:
                layers.append(nn.MaxPool2d(2))
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(width, num_classes)]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
