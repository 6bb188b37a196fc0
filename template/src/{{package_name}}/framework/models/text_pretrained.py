"""A pretrained transformer encoder for texts from Hugging Face ``transformers``, read from a local
directory (saved with ``save_pretrained``), with a new head for the data's outputs
(configs/model/text_pretrained.yaml). Needs the ``text`` extra. Nothing is downloaded: the
directory is read as it is, or refused.

The data's tokenizer is the directory's own (``data.init_args.tokenizer``: the same directory, its
``tokenizer.json``), so the token ids are those the encoder was pretrained on.
"""

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from .text import check_sizes, kept_tokens, mean_over

KEY = "model.init_args.network.init_args"


def transformers_module() -> Any:
    """Hugging Face transformers, offline, or one line saying how to install it."""
    # Read once, as huggingface_hub is imported: no look-up of a name on the Hub, ever.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            "The pretrained text encoder needs Hugging Face transformers: pip install -e '.[text]' (or "
            "pip install transformers)"
        ) from None
    transformers.utils.logging.set_verbosity_error()  # no progress bar or notes as weights load
    transformers.utils.logging.disable_progress_bar()
    return transformers


def read_config(transformers: Any, directory: str) -> Any:
    """The model configuration of the saved model in ``directory`` (its ``config.json``)."""
    if not Path(directory).is_dir():
        raise ConfigError(
            f"{KEY}.weights: no such directory {directory}; give the directory of a transformers model "
            "saved with save_pretrained"
        )
    if not (Path(directory) / "config.json").is_file():
        raise ConfigError(
            f"{KEY}.weights: {directory} is not a transformers model directory (it has no config.json); "
            "give the directory of a model saved with save_pretrained"
        )
    try:
        return transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    except (ValueError, OSError) as error:  # an unknown model_type, or a file it cannot read
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"{KEY}.weights: {directory} is not a transformers model ({reason})") from None


def read_encoder(transformers: Any, directory: str, config: Any) -> nn.Module:
    """The encoder saved in ``directory``, its weights in float32, refusing weights it cannot read."""
    try:
        return transformers.AutoModel.from_pretrained(
            directory, config=config, local_files_only=True, dtype=torch.float32
        )
    except Exception as error:  # OSError for no weights file; safetensors' own error for a damaged one
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(
            f"{KEY}.weights: {directory} holds no weights transformers can read ({reason}); save the "
            "model again with save_pretrained"
        ) from None


class PretrainedTextEncoder(nn.Module):
    """A pretrained transformer encoder, the mean of its last outputs over each text's tokens (the
    padding left out), and a new linear head.

    It takes the token ids of ``framework/data/text.py``, ``[samples, tokens]`` padded with id 0:
    the padding is masked out of the attention and of the mean, as ``TextTransformer`` masks it.
    An encoder whose padding token has another id (RoBERTa's, 1), for which the data traded that
    id with 0, gets its own ids back. The encoder's own pooler, if it has one, is left out.

    ``model.init_args.freeze_epochs`` and ``backbone_lr_scale`` fine-tune it: the head is
    ``head``, the encoder is the backbone.

    Args:
        weights: the directory of a transformers model saved with ``save_pretrained`` (its
            ``config.json`` and weights), read without the network. A checkpoint of this project
            rebuilds the encoder from ``config`` instead: only a new fit reads the directory.
        vocab_size: the tokens of the data's tokenizer, at most the encoder's; from the data.
        max_length: the most tokens of a text, at most the encoder's positions; from the data.
        num_outputs: the outputs: one per class, or one regression target; from the data.
        dropout: dropout before the head.
        config: the encoder's configuration, which a checkpoint saves; not set by hand.
    """

    def __init__(
        self,
        weights: str | None = None,
        vocab_size: int | None = None,
        max_length: int | None = None,
        num_outputs: int | None = None,
        dropout: float = 0.1,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        check_sizes(vocab_size, max_length, num_outputs)
        if weights is not None and weights.lower() in ("none", "null"):
            weights = None  # as the command line gives a nested null
        if weights is None and config is None:
            raise ConfigError(
                f"{KEY}.weights: give the directory of a transformers model saved with save_pretrained"
            )
        transformers = transformers_module()
        if weights is None:
            encoder_config = transformers.AutoConfig.for_model(**config)
        else:
            encoder_config = read_config(transformers, weights)
        check_fits(encoder_config, weights or "the checkpoint's encoder", vocab_size, max_length)
        if weights is None:  # a checkpoint's weights replace these
            self.encoder = transformers.AutoModel.from_config(encoder_config, dtype=torch.float32)
        else:
            self.encoder = read_encoder(transformers, weights, encoder_config)
        self.encoder.train()  # from_pretrained leaves it in eval mode, its dropout off
        self.padding_id = encoder_config.pad_token_id or 0
        if getattr(self.encoder, "pooler", None) is not None:
            self.encoder.pooler = None  # unused: its weights would get no gradient (DDP waits for them)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder_config.hidden_size, num_outputs)

    def checkpoint_init_args(self) -> dict[str, Any]:
        """What rebuilds this network without its directory: its configuration, as plain values."""
        return {"weights": None, "config": json.loads(self.encoder.config.to_json_string(use_diff=False))}

    def freeze(self, frozen: bool) -> None:
        """Freeze the encoder (all but the head), or unfreeze it. Its dropout stays on: it has no
        batch-norm statistics to keep."""
        self.encoder.requires_grad_(not frozen)

    def forward(self, ids: Tensor) -> Tensor:
        kept = kept_tokens(ids)
        if self.padding_id:
            ids = torch.where(ids == 0, self.padding_id, torch.where(ids == self.padding_id, 0, ids))
        outputs = self.encoder(input_ids=ids, attention_mask=kept.long()).last_hidden_state
        return self.head(self.dropout(mean_over(outputs, kept)))


def check_fits(config: Any, source: str, vocab_size: int, max_length: int) -> None:
    """Refuse an encoder that the data's token ids do not fit: a decoder too, which needs more
    than the texts' ids."""
    if config.is_encoder_decoder:
        raise ConfigError(
            f"{KEY}.weights: {source} is an encoder-decoder ({config.model_type}); give an encoder such as "
            "BERT's"
        )
    embeddings = getattr(config, "vocab_size", None)
    if embeddings is not None and vocab_size > embeddings:
        raise ConfigError(
            f"{KEY}.weights: the data's tokenizer has {vocab_size} tokens but {source} embeds {embeddings}; "
            "give data.init_args.tokenizer the model's own directory"
        )
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and max_length > positions:
        raise ConfigError(
            f"{KEY}.weights: data.init_args.max_length={max_length} but {source} has {positions} "
            f"positions; set data.init_args.max_length to at most {positions}"
        )
