"""The byte layout: how models trained from scratch see a multi-turn conversation.

Producers build live episodes in it and the trainer builds SFT demonstrations
in it (through :class:`policy.prompt_format.ByteLayout`, whose rules are the
functions here), so both see byte-for-byte the same layout:

    BOS "tools:calc\n" <prompt> <policy turn> EOS <observation> <policy turn> EOS ...

Only policy turns (their EOS included) are marked as the model's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from policy.tokenizer import Tokenizer


def tool_header(tool_names: Sequence[str]) -> str:
    return f"tools:{','.join(tool_names)}\n" if tool_names else ""


def opening_tokens(tokenizer: Tokenizer, *, tool_names: Sequence[str], prompt: str) -> list[int]:
    """BOS (where the tokenizer has one; Qwen's have none), the tool header and the prompt."""
    bos = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
    return bos + tokenizer.encode(tool_header(tool_names) + prompt)


def demonstrated_tokens(tokenizer: Tokenizer, text: str) -> list[int]:
    """A demonstrated policy turn: its text, ended by EOS like a sampled one."""
    return [*tokenizer.encode(text), tokenizer.eos_id]


@dataclass
class Conversation:
    tokenizer: Tokenizer
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behaviour_logprobs: list[float] = field(default_factory=list)

    @classmethod
    def start(cls, tokenizer: Tokenizer, *, tool_names: Sequence[str], prompt: str) -> Conversation:
        conversation = cls(tokenizer)
        conversation._extend(opening_tokens(tokenizer, tool_names=tool_names, prompt=prompt), mask=0)
        return conversation

    def _extend(self, token_ids: Sequence[int], *, mask: int, logprobs: Sequence[float] | None = None):
        self.token_ids.extend(token_ids)
        self.loss_mask.extend([mask] * len(token_ids))
        self.behaviour_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(token_ids))

    def add_environment(self, text: str) -> None:
        self._extend(self.tokenizer.encode(text), mask=0)

    def add_policy_tokens(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> None:
        """A sampled policy turn, with the log-probabilities it was sampled with."""
        self._extend(token_ids, mask=1, logprobs=logprobs)

    def add_policy_text(self, text: str) -> None:
        """A demonstrated policy turn; it ends with EOS like a sampled one."""
        self._extend(demonstrated_tokens(self.tokenizer, text), mask=1)

    def __len__(self) -> int:
        return len(self.token_ids)
