"""Token statistics of a dataset version under a run tokenizer: how much SFT it is.

The choices are the run tokenizers a config can name (``model.tokenizer``):
``byte`` (one token a UTF-8 byte, policy's ByteTokenizer) and every model
directory under the operator's model roots that holds a ``tokenizer.json``
(SmolLM2 once ``make models`` imported it), read with the ``tokenizers``
library, as policy's HFTokenizer reads it; the platform never imports policy.
Counts are of the messages' text, without the prompt layout's markup, which
depends on the run's prompt format. The datasets worker counts them once per
version and tokenizer (services.version_token_stats_compute) and pages read
the stored DatasetTokenStats.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings

from .models import DatasetVersion
from .selectors import dataset_rows

# Rows counted: enough for the statistics to say what the dataset is, fast enough for a page.
TOKEN_STATS_ROWS = 2000


@dataclass(frozen=True)
class TokenStats:
    rows: int  # counted (at most TOKEN_STATS_ROWS)
    tokens: int
    assistant_tokens: int  # what SFT trains on
    mean_tokens_per_row: float
    max_tokens_per_row: int


def tokenizer_choices() -> list[tuple[str, str]]:
    """(value, label): ``byte``, then each model directory with a tokenizer.json under the model roots."""
    choices = [("byte", "byte (one token per UTF-8 byte)")]
    for root in settings.TANDEM_MODEL_ROOTS:
        if not Path(root).is_dir():
            continue
        for directory in sorted(Path(root).iterdir()):
            if (directory / "tokenizer.json").is_file():
                choices.append((str(directory), directory.name))
    return choices


@lru_cache(maxsize=4)
def _hf_tokenizer(directory: str):
    from tokenizers import Tokenizer  # only when a page asks for it: loading one takes a moment

    return Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))


def _counter(tokenizer: str):
    if tokenizer == "byte":
        return lambda text: len(text.encode("utf-8"))
    hf = _hf_tokenizer(tokenizer)
    return lambda text: len(hf.encode(text, add_special_tokens=False).ids) if text else 0


def version_token_counts(*, version: DatasetVersion, tokenizer: str) -> TokenStats:
    """Token counts of the first TOKEN_STATS_ROWS rows of ``version`` under ``tokenizer`` (a choice's value).

    A minute of CPU at worst: the datasets worker's job, never a request's.
    """
    count = _counter(tokenizer)
    per_row, assistant = [], 0
    for messages in dataset_rows(version=version).values_list("messages", flat=True)[:TOKEN_STATS_ROWS]:
        row_tokens = 0
        for message in messages:
            tokens = count(message["content"])
            row_tokens += tokens
            if message["role"] == "assistant":
                assistant += tokens
        per_row.append(row_tokens)
    total = sum(per_row)
    return TokenStats(rows=len(per_row), tokens=total, assistant_tokens=assistant,
                      mean_tokens_per_row=total / len(per_row) if per_row else 0.0,
                      max_tokens_per_row=max(per_row, default=0))
