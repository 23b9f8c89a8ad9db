"""Human labels for RunConfig's fields, derived once from their names.

The schema's titles are pydantic's ("Rl Learning Rate", "Rollout Timeout S"): a
rule over the field's own name reads better ("RL learning rate", "Timeout (s)")
once acronyms and units are spelled as people write them. A few names say too
little on their own (``rollout.timeout_s``, ``algorithm.name``); the table of
labels by path covers them.
"""

from __future__ import annotations

# How a word of a field name is written in a label (acronyms, abbreviations).
WORDS = {
    "rl": "RL", "sft": "SFT", "kl": "KL", "lora": "LoRA", "fsdp": "FSDP", "mlp": "MLP", "qkv": "QKV",
    "qk": "QK", "rms": "RMS", "rope": "RoPE", "kv": "KV", "hf": "Hugging Face", "eps": "epsilon",
    "num": "number of", "coef": "coefficient", "grad": "gradient", "chars": "characters", "seq": "sequence", "len": "length", "param": "parameter", "dir": "directory",
}
# A trailing unit word becomes a unit in brackets: timeout_s -> "Timeout (s)".
UNITS = {"s": "(s)", "ms": "(ms)", "mb": "(MB)"}
# Labels of fields (and section titles) whose name alone is ambiguous or cryptic, by dotted path.
LABELS = {
    "algorithm.name": "Algorithm",
    "optimizer.name": "Optimizer",
    "rollout.timeout_s": "Rollout timeout (s)",
    "evaluation.timeout_s": "Evaluation timeout (s)",
    "evaluation.every_steps": "Evaluate every (RL steps)",
    "algorithm.value.lam": "GAE λ",
    "algorithm.value.gamma": "Discount γ",
    "model.d_model": "Model width (d_model)",
    "model.hf_checkpoint": "Hugging Face checkpoint",
    "sampling.top_p": "Top-p",
    "sampling.top_k": "Top-k",
    "optimizer.b1": "Adam β1",
    "optimizer.b2": "Adam β2",
    "checkpoint.every": "Checkpoint every (steps)",
    "checkpoint.kept": "Checkpoints kept",
    "mesh.data": "Data-parallel devices",
    "mesh.fsdp": "FSDP devices",
    "mesh.tensor": "Tensor-parallel devices",
    "lora.enabled": "Train LoRA adapters only",
    "sft.datasets": "SFT datasets",
    "evaluation.datasets": "Evaluation datasets",
    "evaluation.environment": "Evaluate on the run's environment",
    "evaluation.environments": "Other environments",
    "evaluation.pass_k": "pass@k",
    "algorithm.kl": "KL penalty",
    "algorithm.overlong": "Overlong shaping (DAPO)",
    "algorithm.tool_call_bonus": "Tool-call bonus",
    "algorithm.value": "Value head (PPO)",
    "start_from": "Start from a checkpoint",
    "": "Run",
}


def config_label(path: str) -> str:
    """The label of the field (or section) at dotted ``path``: "rl_learning_rate" -> "RL learning rate"."""
    if path in LABELS:
        return LABELS[path]
    words = path.rsplit(".", 1)[-1].split("_")
    unit = UNITS.get(words[-1]) if len(words) > 1 else None
    if unit:
        words = words[:-1]
    text = " ".join(WORDS.get(word, word) for word in words)
    text = text[:1].upper() + text[1:]  # "RL", "LoRA" keep their case
    return f"{text} {unit}" if unit else text
