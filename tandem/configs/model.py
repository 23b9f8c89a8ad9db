"""The policy's architecture (part of RunConfig), and the rules every description of it obeys.

:class:`ModelConfig` is how a run states the architecture;
``policy.model.TransformerConfig`` is the model's static shape (the same
fields plus the vocabulary, which the tokenizer sets). Both check the
architecture with the rules of this module, :func:`attention_heads`,
:class:`RopeScaling` and :data:`ParamDtype`, so a config the platform accepts
is one the trainer and the producers can build. They are plain Python: the
ground floor imports no JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: The byte tokenizer's vocabulary: 256 bytes, PAD, BOS and EOS (policy/tokenizer.py).
BYTE_VOCAB_SIZE = 259

# Dtypes of the parameters and matmuls.
ParamDtype = Literal["float32", "bfloat16"]
PARAM_DTYPES: tuple[str, ...] = get_args(ParamDtype)

# How an episode's messages become tokens: the model's own chat template, or the byte layout
# nano models trained from scratch learn (policy.byte_layout); auto: the template if the tokenizer has one.
PromptFormat = Literal["auto", "chat_template", "byte"]
# How the policy writes a tool call (environments.tool_calls); auto: what the chat template implies.
ToolCallFormat = Literal["tandem", "qwen", "hermes", "llama3"]
# Whether the reasoning (<think>...</think>) of past assistant turns stays in later turns' context.
PastReasoning = Literal["keep", "drop"]


#: What a layer's queries attend to: ``full``, every earlier token; ``sliding``, only the last
#: ``sliding_window`` tokens, itself included (Gemma 3's local layers).
AttentionKind = Literal["full", "sliding"]
#: The gate of a gated MLP: ``silu`` (SwiGLU: Llama, Qwen) or ``gelu_tanh`` (GeGLU with GELU's tanh
#: approximation: Gemma).
MlpActivation = Literal["silu", "gelu_tanh"]


def attention_heads(
    *, d_model: int, num_heads: int, num_kv_heads: int | None, head_dim: int | None
) -> tuple[int, int]:
    """``(num_kv_heads, head_dim)`` with their defaults resolved (``num_heads``, ``d_model // num_heads``).

    Raises:
      ValueError: num_heads does not divide d_model (and head_dim is not set),
        num_kv_heads does not divide num_heads, or head_dim is odd (rotary
        embeddings rotate pairs of features).
    """
    if head_dim is None:
        if d_model % num_heads:
            raise ValueError(
                f"num_heads must divide d_model (or set head_dim); "
                f"got num_heads={num_heads}, d_model={d_model}"
            )
        head_dim = d_model // num_heads
    if num_kv_heads is None:
        num_kv_heads = num_heads
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads must divide num_heads; got num_kv_heads={num_kv_heads}, num_heads={num_heads}"
        )
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (rotary embeddings); got head_dim={head_dim}")
    return num_kv_heads, head_dim


def _check_rope_type(rope_type: Any) -> None:
    if rope_type != "llama3":
        raise ValueError(
            f"rope_scaling.rope_type must be 'llama3', the only one implemented; got {rope_type!r}"
        )


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3's rotary frequency scaling (the ``"llama3"`` rope type of Hugging Face).

    Wavelengths longer than ``original_max_position_embeddings /
    low_freq_factor`` are stretched by ``factor``, those shorter than
    ``original_max_position_embeddings / high_freq_factor`` are kept, and the
    band between is interpolated smoothly.
    """

    # How much the long wavelengths are stretched (8 for Llama 3.1, 32 for Llama 3.2).
    factor: float
    # Wavelengths above original_max_position_embeddings / low_freq_factor are fully scaled.
    low_freq_factor: float
    # Wavelengths below original_max_position_embeddings / high_freq_factor are untouched.
    high_freq_factor: float
    # Context length of pre-training, before the context was extended.
    original_max_position_embeddings: int
    # Only "llama3" is implemented; kept so the Hugging Face dict round-trips.
    rope_type: str = "llama3"

    def __post_init__(self) -> None:
        _check_rope_type(self.rope_type)
        if not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                f"rope_scaling.high_freq_factor={self.high_freq_factor} must exceed "
                f"low_freq_factor={self.low_freq_factor}"
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RopeScaling:
        """From the Hugging Face dict form; refuses another rope type, and unknown, missing
        or non-numeric keys, by name."""
        _check_rope_type(values.get("rope_type", "llama3"))
        fields = {field.name for field in dataclasses.fields(cls)}
        unknown = set(values) - fields
        if unknown:
            raise ValueError(f"rope_scaling has unknown keys {sorted(unknown)}")
        numbers = fields - {"rope_type"}
        missing = numbers - set(values)
        if missing:
            raise ValueError(f"rope_scaling lacks keys {sorted(missing)}")
        if any(isinstance(values[key], bool) or not isinstance(values[key], int | float) for key in numbers):
            raise ValueError(f"rope_scaling values {sorted(numbers)} must be numbers")
        return cls(
            factor=float(values["factor"]),
            low_freq_factor=float(values["low_freq_factor"]),
            high_freq_factor=float(values["high_freq_factor"]),
            original_max_position_embeddings=int(values["original_max_position_embeddings"]),
            rope_type=str(values.get("rope_type", "llama3")),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ModelConfig(BaseModel):
    """Shape of the decoder-only transformer policy.

    The defaults are the nano model trained from scratch with the byte
    tokenizer. With ``hf_checkpoint`` set, the architecture comes from the
    checkpoint's config.json instead and only ``max_seq_len`` and
    ``param_dtype`` of this config apply.
    """

    model_config = ConfigDict(extra="forbid")

    d_model: int = Field(64, ge=8, le=8192, description="Width of the residual stream.")
    num_layers: int = Field(2, ge=1, le=128, description="Number of transformer blocks.")
    num_heads: int = Field(
        4, ge=1, le=128, description="Query heads; must divide d_model unless head_dim is set."
    )
    mlp_dim: int = Field(256, ge=8, le=65536, description="Hidden width of each MLP.")
    max_seq_len: int = Field(
        512, ge=16, le=32768,
        description=(
            "Longest episode in tokens (prompt, every turn and observation): room for a multi-turn "
            "environment's first turns. An episode with no room left for another turn ends truncated."
        ),
    )
    num_kv_heads: int | None = Field(
        None,
        ge=1,
        le=128,
        description="Key/value heads (grouped-query attention); must divide num_heads. None: num_heads.",
    )
    head_dim: int | None = Field(
        None,
        ge=2,
        le=1024,
        description="Width of each attention head (even). None: d_model / num_heads.",
    )
    rope_theta: float = Field(
        10_000.0, gt=0, description="Base wavelength of the rotary position embedding."
    )
    rope_scaling: dict[str, float | str] | None = Field(
        None,
        description=(
            "Llama-3 rotary scaling, as in Hugging Face: {rope_type: 'llama3', factor, "
            "low_freq_factor, high_freq_factor, original_max_position_embeddings}. None: plain RoPE."
        ),
    )
    rms_norm_eps: float = Field(1e-6, gt=0, le=0.1, description="Epsilon of every RMSNorm.")
    qkv_bias: bool = Field(False, description="Biases on the query/key/value projections (Qwen2).")
    qk_norm: bool = Field(
        False, description="RMSNorm on each query and key head before the rotary embedding (Qwen3)."
    )
    tie_embeddings: bool = Field(
        False, description="The output head shares the token embedding matrix."
    )
    param_dtype: ParamDtype = Field(
        "float32", description="Dtype of the parameters and matmuls; logits are float32 either way."
    )
    tokenizer: str = Field(
        "byte",
        description=(
            "'byte' (the byte-level default), or a local directory holding tokenizer.json "
            "(usually the hf_checkpoint directory), under one of the operator's TANDEM_MODEL_ROOTS."
        ),
    )
    prompt_format: PromptFormat = Field(
        "auto",
        description=(
            "chat_template: episodes are rendered with the tokenizer's chat template (system, user, "
            "assistant and tool messages, tools as JSON schemas); byte: the byte layout of models trained "
            "from scratch; auto: chat_template whenever the tokenizer has a template, else byte."
        ),
    )
    tool_call_format: ToolCallFormat | Literal["auto"] = Field(
        "auto",
        description=(
            "How the policy writes tool calls: qwen or hermes (<tool_call> JSON blocks), llama3 (a JSON "
            "object), tandem (name(argument), for byte models); auto: what the chat template implies "
            "(hermes, described in a system message, when the template knows no tools)."
        ),
    )
    chat_template_kwargs: dict[str, bool | int | float | str] = Field(
        default_factory=dict,
        description="Extra variables for the chat template, e.g. {enable_thinking: false} for Qwen3.",
    )
    past_reasoning: PastReasoning = Field(
        "keep",
        description=(
            "keep: every sampled token stays in the context of later turns (token in, token out); drop: "
            "the <think>...</think> reasoning of past turns leaves the context, as reasoning models' "
            "templates render history, and each turn trains on the context it was sampled in."
        ),
    )
    hf_checkpoint: str | None = Field(
        None,
        description=(
            "Local directory of a Hugging Face Llama/Qwen2/Qwen3 checkpoint (config.json and "
            "*.safetensors) to initialize the policy from, under one of the operator's "
            "TANDEM_MODEL_ROOTS; its config.json sets the architecture."
        ),
    )

    @model_validator(mode="after")
    def _architecture_is_buildable(self):
        attention_heads(
            d_model=self.d_model,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
        )
        if self.rope_scaling is not None:
            RopeScaling.from_dict(self.rope_scaling)
        if self.tokenizer == "byte" and self.prompt_format == "chat_template":
            raise ValueError("model.prompt_format=chat_template needs a model.tokenizer with a chat template; "
                             "the byte tokenizer has none")
        if self.past_reasoning == "drop" and (self.prompt_format == "byte" or self.tokenizer == "byte"):
            raise ValueError("model.past_reasoning=drop needs a chat template (model.prompt_format "
                             "chat_template, and a model.tokenizer that has one)")
        return self
