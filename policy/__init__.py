"""The policy, as both processes run it: model, tokenizers, prompt formats, weights, inference.

This is the package's public face: the trainer, the rollout workers and the
benchmarks import what they need from here (``from policy import
InferenceEngine``), never from its modules, which are private and may move.

- The model family and the run's policy: :class:`Transformer` and its
  :class:`TransformerConfig` (whose rules it shares with the run config's
  ``ModelConfig``), :func:`create_model`, :func:`policy_config`.
- Hugging Face checkpoints in and out: :func:`load_hf_checkpoint`,
  :func:`export_hf_checkpoint`, :class:`CheckpointError`; :func:`import_model` makes
  one of a GGUF file (``tandem models import``).
- Tokenizers and prompt formats: :func:`load_tokenizer`; :func:`prompt_layout`
  picks the model's chat template (:class:`ChatTemplateLayout`) or the byte layout
  (:class:`ByteLayout`, :class:`Conversation`), which build an episode's
  :class:`EpisodeTokens` turn by turn.
- LoRA: :func:`apply_lora`, and the base/adapter split the transports and
  exports use.
- Weight transports behind :class:`WeightPublisher` and :class:`WeightSubscriber`.
- The inference engine (:mod:`policy.engine`): :class:`InferenceEngine`, the
  :class:`SamplingParams` every turn is submitted with, and
  :class:`Sampler`, its synchronous front for callers with all their prompts at hand
  (evaluation, benchmarks).
"""

from policy.byte_layout import Conversation
from policy.chat_template import ChatTemplateError
from policy.compilation_cache import enable_compilation_cache
from policy.engine import Completion, EngineStats, InferenceEngine, SamplingParams
from policy.factory import create_model, policy_config
from policy.hf import CheckpointError, export_hf_checkpoint, load_hf_checkpoint
from policy.lora import FrozenParam, apply_lora, fold_adapters, split_adapters
from policy.model import RopeScaling, Transformer, TransformerConfig, count_parameters, split_model
from policy.model_import import ModelImportError, import_model
from policy.prompt_format import (
    ByteLayout,
    ChatTemplateLayout,
    EpisodeTokens,
    PromptFormatError,
    PromptLayout,
    prompt_layout,
    tool_call_parse_formats,
)
from policy.sampler import Sampler
from policy.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from policy.weights import (
    FilesystemWeightPublisher,
    RedisWeightPublisher,
    RedisWeightSubscriber,
    WeightPublisher,
    WeightsNotVisibleError,
    WeightsTooLargeForRedisError,
    WeightSubscriber,
    publication_bytes,
    weight_publisher,
)

__all__ = [
    # model family and the run's policy
    "RopeScaling",
    "Transformer",
    "TransformerConfig",
    "count_parameters",
    "create_model",
    "policy_config",
    "split_model",
    # Hugging Face checkpoints, and GGUF files or HF directories imported as one
    "CheckpointError",
    "ModelImportError",
    "import_model",
    "export_hf_checkpoint",
    "load_hf_checkpoint",
    # tokenizers and prompt formats
    "ByteLayout",
    "ByteTokenizer",
    "ChatTemplateError",
    "ChatTemplateLayout",
    "Conversation",
    "EpisodeTokens",
    "PromptFormatError",
    "PromptLayout",
    "Tokenizer",
    "load_tokenizer",
    "prompt_layout",
    "tool_call_parse_formats",
    # LoRA
    "FrozenParam",
    "apply_lora",
    "fold_adapters",
    "split_adapters",
    # weight transports
    "FilesystemWeightPublisher",
    "RedisWeightPublisher",
    "RedisWeightSubscriber",
    "WeightPublisher",
    "WeightSubscriber",
    "WeightsNotVisibleError",
    "WeightsTooLargeForRedisError",
    "publication_bytes",
    "weight_publisher",
    # inference
    "Completion",
    "EngineStats",
    "InferenceEngine",
    "Sampler",
    "SamplingParams",
    "enable_compilation_cache",
]
