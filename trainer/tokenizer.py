"""Byte-level tokenizer: every UTF-8 byte is a token, plus a few specials.

It needs no vocabulary file, so a nano model can train from scratch anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

PAD_ID = 256
BOS_ID = 257
# Ends a model turn: the sampler stops there and the environment takes over.
EOS_ID = 258
VOCAB_SIZE = 259


@dataclass(frozen=True)
class ByteTokenizer:
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    vocab_size: int = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        """Decode, dropping special tokens; invalid byte runs become U+FFFD."""
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")
