"""The runs ``tandem up --demo`` submits: the nano model from scratch, or a real instruct model.

``nano`` trains a 0.8M-parameter byte model from scratch on the terse
calculator (``37*58=?``). ``smollm2`` post-trains SmolLM2-135M-Instruct, as
``make models`` imports it, on the calculator asked in words, with its
``calc`` tool described to the model and called in the model's own format
(its chat template knows no tools, so Hermes ``<tool_call>`` blocks,
described in a system message). Both are small enough for a laptop CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Where ``make models`` puts SmolLM2-135M-Instruct; TANDEM_SMOLLM2_DIR overrides it.
SMOLLM2_DIR = Path(os.environ.get("TANDEM_SMOLLM2_DIR", "var/models/smollm2-135m-instruct"))


class DemoModelMissingError(RuntimeError):
    """The demo's model is not where ``make models`` puts it."""


@dataclass(frozen=True)
class DemoRun:
    """A demo run: its name, the built-in environment it uses, and its config overrides."""

    name: str
    environment: str
    config: dict[str, Any] = field(default_factory=dict)


def demo_run(model: str, *, rl_steps: int | None = None) -> DemoRun:
    """The demo run of ``model`` (``nano`` or ``smollm2``), with ``rl_steps`` if given.

    Raises:
      DemoModelMissingError: ``smollm2`` was asked for but never imported.
      ValueError: an unknown model.
    """
    overrides: dict[str, Any] = {"rl_steps": rl_steps} if rl_steps is not None else {}
    if model == "nano":
        return DemoRun(name="demo: calculator", environment="calculator", config=overrides)
    if model != "smollm2":
        raise ValueError(f"unknown demo model {model!r}; known: nano, smollm2")
    directory = SMOLLM2_DIR.resolve()
    if not (directory / "config.json").is_file():
        raise DemoModelMissingError(f"{directory} holds no model: run `make models` to import SmolLM2 first")
    config = {**smollm2_config(directory), **overrides}
    return DemoRun(name="demo: calculator on SmolLM2-135M-Instruct", environment="calculator-chat", config=config)


#: A few steps of small batches: a demo that ends in minutes on a laptop CPU. The SmolLM2 demo
#: runs this long; the new-run form offers it alone as its "fast demo" preset.
SHORT_RUN_CONFIG: dict[str, Any] = {
    "rollout": {"group_size": 4, "groups_per_step": 2, "groups_per_task": 1, "max_turns": 3},
    "sft_steps": 4, "sft_batch_size": 4, "rl_steps": 4,
}


def smollm2_config(directory: Path) -> dict[str, Any]:
    """The SmolLM2 demo's config overrides for the model imported at ``directory``.

    The new-run form offers the same as its "real model" preset.
    """
    return {
        "model": {"hf_checkpoint": str(directory), "tokenizer": str(directory), "max_seq_len": 512},
        # A Hermes tool call is about 30 tokens; the answer after it a few.
        "sampling": {"max_new_tokens": 48, "temperature": 0.8},
        # A few steps of the environment's demonstrations teach the answer format, then GRPO,
        # with learning rates for a pretrained model rather than one trained from scratch.
        **SHORT_RUN_CONFIG,
        "learning_rate": 3e-5, "rl_learning_rate": 1e-5,
        # A laptop's memory: micro-batches of four 512-token rows, each block recomputed in the
        # backward pass, and logits of 1,024 tokens at a time (200 MB at SmolLM2's 49,152 tokens);
        # the whole step at once held several GB more, and the kernel killed the trainer beside
        # another suite.
        "memory": {"micro_batch_tokens": 2048, "remat": "full", "logits_chunk_tokens": 1024},
    }
