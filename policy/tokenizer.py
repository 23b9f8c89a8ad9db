"""Tokenizers: the byte-level default and Hugging Face ``tokenizer.json`` files.

:class:`ByteTokenizer` makes every UTF-8 byte a token, plus a few specials. It
needs no vocabulary file, so a nano model can train from scratch anywhere.
:class:`HFTokenizer` serves pretrained checkpoints through the same interface
(``encode``, ``decode``, ``bos_id``, ``eos_id``, ``pad_id``, ``vocab_size``);
:func:`load_tokenizer` picks one from a spec.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tokenizers

from tandem.configs.model import BYTE_VOCAB_SIZE

PAD_ID = 256
BOS_ID = 257
# Ends a model turn: the sampler stops there and the environment takes over.
EOS_ID = 258
VOCAB_SIZE = BYTE_VOCAB_SIZE


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


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` behind the same interface as :class:`ByteTokenizer`.

    ``encode`` adds no special tokens (chat templates place them; special
    tokens written in the text, e.g. ``<|im_end|>``, are recognized);
    ``decode`` drops them, like ByteTokenizer's. ``eos_id`` is the token that
    ends a model turn (the sampler stops there), so for chat models it is the
    end-of-turn token (``<|im_end|>``, ``<|eot_id|>``), which is what their
    tokenizer_config.json names as ``eos_token``. ``bos_id`` is None for
    tokenizers without one (Qwen); ``pad_id`` falls back to ``eos_id`` (padding
    is masked everywhere, so any valid id works).
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        eos_token: str | int,
        bos_token: str | int | None = None,
        pad_token: str | int | None = None,
        chat_template: str | None = None,
    ):
        self._tokenizer = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_id: int = self._token_id(eos_token, "eos_token")
        self.bos_id: int | None = (
            None if bos_token is None else self._token_id(bos_token, "bos_token")
        )
        self.pad_id: int = (
            self.eos_id if pad_token is None else self._token_id(pad_token, "pad_token")
        )
        # Jinja source of the chat template, rendered by policy.chat_template; None if absent.
        self.chat_template = chat_template

    def _token_id(self, token: str | int, field: str) -> int:
        if isinstance(token, int):
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"{field}={token} is outside the vocabulary of {self.vocab_size}")
            return token
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{field}={token!r} is not a token of this tokenizer")
        return token_id

    def token(self, token_id: int) -> str:
        """The string form of one token id (e.g. ``"<|im_end|>"``)."""
        return self._tokenizer.id_to_token(token_id)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int]) -> str:
        """Decode, dropping special tokens."""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def is_special(self, token_id: int) -> bool:
        """Whether ``token_id`` is one of the tokenizer's special tokens (``<|im_end|>``, ``<end_of_turn>``)."""
        added = self._tokenizer.get_added_tokens_decoder().get(token_id)
        return added is not None and added.special

    def decode_with_specials(self, token_ids: list[int]) -> str:
        """Decode, writing special tokens as their text (``<|im_start|>``): what the model saw."""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=False)

    @classmethod
    def from_directory(
        cls,
        path: str | Path,
        *,
        eos_token: str | int | None = None,
        bos_token: str | int | None = None,
        pad_token: str | int | None = None,
    ) -> HFTokenizer:
        """Load ``tokenizer.json`` with the special tokens and chat template found beside it.

        Special tokens come from the arguments, else tokenizer_config.json, else
        special_tokens_map.json. The chat template comes from
        tokenizer_config.json's ``chat_template`` (its "default" entry if it is
        a list) or from a ``chat_template.jinja`` file.

        Raises:
          ValueError: no tokenizer.json, no end-of-sequence token, or a named
            special token that the vocabulary lacks.
        """
        directory = Path(path)
        if not (directory / "tokenizer.json").exists():
            raise ValueError(f"{directory} has no tokenizer.json")
        tokenizer = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        config = _read_optional_json(directory / "tokenizer_config.json")
        special_tokens_map = _read_optional_json(directory / "special_tokens_map.json")

        def special(name: str, override: str | int | None) -> str | int | None:
            if override is not None:
                return override
            for source in (config, special_tokens_map):
                value = source.get(name)
                if isinstance(value, dict):  # an AddedToken: {"content": ..., ...}
                    value = value.get("content")
                if value:
                    return value
            return None

        eos = special("eos_token", eos_token)
        if eos is None:
            raise ValueError(
                f"{directory} names no eos_token (tokenizer_config.json, special_tokens_map.json); "
                "pass eos_token explicitly"
            )
        chat_template = config.get("chat_template")
        if isinstance(chat_template, list):
            named = {entry.get("name"): entry.get("template") for entry in chat_template}
            chat_template = named.get("default")
        template_file = directory / "chat_template.jinja"
        if chat_template is None and template_file.exists():
            chat_template = template_file.read_text()
        return cls(
            tokenizer,
            eos_token=eos,
            bos_token=special("bos_token", bos_token),
            pad_token=special("pad_token", pad_token),
            chat_template=chat_template,
        )


def _read_optional_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


Tokenizer = ByteTokenizer | HFTokenizer


def load_tokenizer(spec: str, **special_tokens: str | int | None) -> Tokenizer:
    """``"byte"`` for the byte tokenizer, or a directory holding a tokenizer.json.

    ``special_tokens`` (``eos_token``, ``bos_token``, ``pad_token``) override the
    directory's; the byte tokenizer takes none.
    """
    if spec == "byte":
        if any(value is not None for value in special_tokens.values()):
            raise ValueError("the byte tokenizer's special tokens are fixed")
        return ByteTokenizer()
    if Path(spec).is_dir():
        return HFTokenizer.from_directory(spec, **special_tokens)
    raise ValueError(f"tokenizer spec {spec!r} is neither 'byte' nor a directory")
