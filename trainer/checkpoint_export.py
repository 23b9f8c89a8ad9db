"""A run's Orbax checkpoint as a Hugging Face safetensors checkpoint (config.json + model.safetensors).

The platform worker runs this for a user's export request: it rebuilds the
run's train state from the run config exactly as the trainer does (only its
structure matters, the values come from the checkpoint), restores one step
into it and writes the policy with :func:`policy.export_hf_checkpoint`.
A critic (PPO) is left out and LoRA adapters are folded into their kernels,
so the result loads as a plain model anywhere.
"""

from __future__ import annotations

from pathlib import Path

from flax import nnx

from policy import (
    Transformer,
    create_model,
    export_hf_checkpoint,
    fold_adapters,
    load_tokenizer,
    split_adapters,
)
from tandem.configs.run import RunConfig
from trainer.learner import Learner


def restore_policy(run_config: dict, *, run_directory: Path, step: int) -> Transformer:
    """The plain policy of checkpoint ``step`` of the run whose checkpoints are in ``run_directory``."""
    config = RunConfig.model_validate(run_config)
    vocab_size = load_tokenizer(config.model.tokenizer).vocab_size
    # The structure the trainer saved: built as the trainer builds it, off its mesh.
    learner = Learner(config, vocab_size=vocab_size, on_mesh=False)
    algorithm, graphdef = learner.algorithm, learner.graphdef
    restored = learner.read_checkpoint(run_directory, step)
    params = restored.params["policy"] if algorithm.needs_value_head else restored.params
    if not config.lora.enabled:
        if algorithm.needs_value_head:
            return nnx.merge(graphdef, restored.params).policy
        return nnx.merge(graphdef, params)
    adapters, base = split_adapters(params)
    folded = fold_adapters(nnx.to_pure_dict(base), nnx.to_pure_dict(adapters), config.lora.scale)
    plain = create_model(config.model, vocab_size=vocab_size, rngs=nnx.Rngs(config.seed))
    plain_params = nnx.state(plain, nnx.Param)
    nnx.replace_by_pure_dict(plain_params, folded)
    nnx.update(plain, plain_params)
    return plain


def export_checkpoint(run_config: dict, *, run_directory: Path, step: int, destination: Path) -> list[Path]:
    """Write checkpoint ``step`` as a Hugging Face checkpoint into ``destination``; returns the files."""
    model = restore_policy(run_config, run_directory=run_directory, step=step)
    return export_hf_checkpoint(model, destination)
