"""A transformer encoder for texts, trained from scratch on the token ids of
``framework/data/text.py`` (configs/model/text_transformer.yaml)."""

import torch
from torch import Tensor, nn

from ..errors import ConfigError

KEY = "model.init_args.network.init_args"


class TextTransformer(nn.Module):
    """Token and position embeddings, a transformer encoder, the mean of its outputs over each
    text's tokens, and a linear head.

    It takes a batch of token ids, ``[samples, tokens]``, padded with id 0 after each text's last
    token: the padding is left out of the attention and of the mean, so that a text's outputs do
    not depend on how far its batch is padded.

    Args:
        vocab_size: the tokens of the data's tokenizer; the command line sets it from the data.
        max_length: the most tokens of a text, the positions the network learns; from the data.
        num_outputs: the outputs: one per class, or one regression target; from the data.
        d_model: the width of the embeddings and of the encoder.
        heads: the attention heads of each layer (``d_model`` must be a multiple).
        layers: the encoder's layers.
        feedforward: the width of each layer's feed-forward part.
        dropout: dropout in the encoder and before the head.
        embedding_dropout: dropout on the token and position embeddings, the encoder's input.
        token_dropout: in training, each token of a text is left out with this probability (as
            padding is), as if the text lacked that word: the network cannot lean on a few words
            alone. A regularizer for a few thousand texts.
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        max_length: int | None = None,
        num_outputs: int | None = None,
        d_model: int = 64,
        heads: int = 4,
        layers: int = 2,
        feedforward: int = 128,
        dropout: float = 0.1,
        embedding_dropout: float = 0.0,
        token_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_sizes(vocab_size, max_length, num_outputs)
        if d_model % heads:
            raise ConfigError(f"{KEY}.d_model={d_model} must be a multiple of heads={heads}")
        if not 0 <= token_dropout < 1:
            raise ConfigError(f"{KEY}.token_dropout={token_dropout} must be at least 0 and below 1")
        self.token_dropout = token_dropout
        self.tokens = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.positions = nn.Embedding(max_length, d_model)
        self.embedding_dropout = nn.Dropout(embedding_dropout)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, feedforward, dropout, activation="gelu", batch_first=True, norm_first=True
        )
        # The fast path for inference (nested tensors) would make outputs depend on the padding.
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(d_model, num_outputs)

    def forward(self, ids: Tensor) -> Tensor:
        if self.training and self.token_dropout:
            ids = ids.masked_fill(torch.rand(ids.shape, device=ids.device) < self.token_dropout, 0)
        kept = kept_tokens(ids)
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.embedding_dropout(self.tokens(ids) + self.positions(positions))
        x = self.encoder(x, src_key_padding_mask=~kept)
        return self.head(self.dropout(mean_over(self.norm(x), kept)))


def check_sizes(vocab_size: int | None, max_length: int | None, num_outputs: int | None) -> None:
    """Refuse a network for texts without the sizes the command line takes from the data."""
    if vocab_size is None or max_length is None or num_outputs is None:
        raise ConfigError(
            f"{KEY}: give vocab_size, max_length and num_outputs (the command line takes them from the data)"
        )


def kept_tokens(ids: Tensor) -> Tensor:
    """Where the token ids are a text's tokens, not its padding (id 0). A text of no tokens at all
    keeps its first position, so that attention has a key to attend to."""
    kept = ids != 0
    kept[:, 0] = True
    return kept


def mean_over(outputs: Tensor, kept: Tensor) -> Tensor:
    """The mean of each text's outputs, ``[samples, tokens, width]``, over its kept tokens."""
    weights = kept.unsqueeze(-1).to(outputs.dtype)
    return (outputs * weights).sum(dim=1) / weights.sum(dim=1)
