"""A multi-layer perceptron for flat feature vectors (digits' 8x8 images are 64 features)."""

from collections.abc import Sequence

from torch import Tensor, nn


class MLP(nn.Module):
    """Linear layers with batch norm, ReLU and dropout between them."""

    def __init__(
        self,
        in_features: int = 64,
        num_classes: int = 10,
        hidden_sizes: Sequence[int] = (256, 128),
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if min(in_features, *hidden_sizes) < 1:
            sizes = f"{in_features} and {list(hidden_sizes)}"
            raise ValueError(f"network.in_features and hidden_sizes must be positive, got {sizes}")
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
