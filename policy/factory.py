"""The policy a run starts from, and its architecture: from the run config, or its checkpoint.

Trainer and producers both build the run's policy through these two
functions, so their structures match: the producers' abstract model must have
exactly the parameters the trainer publishes.
"""

from __future__ import annotations

from flax import nnx

from policy.hf import CheckpointError, load_hf_checkpoint, load_hf_config
from policy.model import Transformer, TransformerConfig
from tandem.configs.model import ModelConfig


def policy_config(model_config: ModelConfig, *, vocab_size: int) -> TransformerConfig:
    """The architecture a run's policy has; trainer and producers must agree on it."""
    if model_config.hf_checkpoint is None:
        return TransformerConfig.from_model_config(model_config, vocab_size)
    return load_hf_config(
        model_config.hf_checkpoint,
        max_seq_len=model_config.max_seq_len,
        param_dtype=model_config.param_dtype,
    )


def create_model(model_config: ModelConfig, *, vocab_size: int, rngs: nnx.Rngs) -> Transformer:
    """The policy a run starts from: its ``hf_checkpoint`` if set, else a fresh model.

    With a checkpoint, ``vocab_size`` (the tokenizer's) must not exceed the
    checkpoint's embedding rows, and ``max_seq_len`` and ``param_dtype`` come
    from the run config.
    """
    if model_config.hf_checkpoint is None:
        config = TransformerConfig.from_model_config(model_config, vocab_size)
        return Transformer(config, rngs=rngs)
    model = load_hf_checkpoint(
        model_config.hf_checkpoint,
        param_dtype=model_config.param_dtype,
        max_seq_len=model_config.max_seq_len,
    )
    if vocab_size > model.config.vocab_size:
        raise CheckpointError(
            f"the tokenizer has {vocab_size} tokens but {model_config.hf_checkpoint} embeds "
            f"only {model.config.vocab_size}"
        )
    return model
