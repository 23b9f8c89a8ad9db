"""The SFT phase's data: uploaded dataset versions and the environment's demonstrations, mixed by weight.

A run's config pins dataset versions (``sft.datasets``, each with a weight)
and the weight of the environment's demonstrations
(``sft.demonstrations_weight``). The trainer reads each pinned version's rows
over the platform's trainer API before SFT starts (it has no database), as
chat messages (:func:`tandem.contracts.stored_row_messages`), with their tool
calls written in the run's own tool-call format, so that they render exactly
as a producer's demonstrations do.

Each version's held-out rows (``dataset_rows_held_out``) are set apart when
it is loaded: SFT never draws them, and held-out evaluation
(``trainer/dataset_evaluation.py``) scores the policy on them.

Each SFT step draws its ``sft_batch_size`` examples' sources by weight, then
each dataset's examples uniformly (with replacement), from an RNG seeded by
the run's seed and the step: a run resumed from a checkpoint draws what an
uninterrupted one would have.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from environments import format_tool_call
from tandem.configs.sft import SFTConfig
from tandem.contracts import (
    DATASET_ROWS_PAGE_MAX,
    DemonstrationMessage,
    dataset_rows_held_out,
    stored_row_messages,
)
from trainer.platform_client import PlatformClient

#: The metric (per SFT step) of how many examples came from the environment's demonstrations;
#: a dataset's is ``sft/rows/<its index in sft.datasets>``.
DEMONSTRATIONS_ROWS_METRIC = "sft/rows/demonstrations"
#: Tokens of the step's batch (padding excluded), beside tokens_per_s.
SFT_TOKENS_METRIC = "sft/tokens"


def dataset_rows_metric(index: int) -> str:
    return f"sft/rows/{index}"


def with_written_calls(messages: Sequence[DemonstrationMessage], tool_call_format: str) -> list[DemonstrationMessage]:
    """``messages`` with each assistant's tool calls written after its text, as the model writes them."""
    written = []
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            calls = [format_tool_call(call.name, call.arguments, tool_call_format) for call in message.tool_calls]
            content = "\n".join([message.content, *calls] if message.content else calls)
            message = message.model_copy(update={"content": content})
        written.append(message)
    return written


Conversation = tuple[DemonstrationMessage, ...]


class DatasetHasNoRowsError(ValueError):
    """A dataset version has no row of the split a run needs (all held out, or none held out)."""


@dataclass(frozen=True)
class DatasetSource:
    """One pinned dataset version's rows, ready to render: its training split, and its held-out split
    (``tandem.contracts.dataset_rows_held_out``), which SFT never draws from."""

    name: str
    version: int
    weight: float
    rows: tuple[Conversation, ...]
    held_out_rows: tuple[Conversation, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"


def load_dataset(platform: PlatformClient, run_id: int, *, name: str, version: int, weight: float,
                 tool_call_format: str, between_pages: Callable[[], None] = lambda: None,
                 page_size: int = DATASET_ROWS_PAGE_MAX) -> DatasetSource:
    """Every row of ``name@version`` from the platform, page by page, split into training and held-out
    rows; ``between_pages`` runs after each page, and between the retries of a page the platform
    failed to serve (the run's heartbeat: a cancel is seen while a broken version is retried)."""
    stored: list[dict] = []
    while True:
        page = platform.dataset_rows(run_id, name, version, offset=len(stored), limit=page_size,
                                     between_retries=between_pages)
        stored.extend(page.rows)
        between_pages()
        if not page.rows or len(stored) >= page.total:
            break
    training: list[Conversation] = []
    held_out: list[Conversation] = []
    for row, is_held_out in zip(stored, dataset_rows_held_out(stored), strict=True):
        conversation = tuple(with_written_calls(stored_row_messages(row), tool_call_format))
        (held_out if is_held_out else training).append(conversation)
    return DatasetSource(name=name, version=version, weight=weight, rows=tuple(training),
                         held_out_rows=tuple(held_out))


def rendered_conversations(layout, tools, conversations: Sequence[Sequence[DemonstrationMessage]], *,
                           max_len: int) -> tuple[list[list[int]], list[list[int]], int]:
    """Token ids and loss masks of chat conversations, rendered by ``layout`` (a policy prompt layout)
    as producers render episodes with ``tools`` described, each cut to ``max_len`` tokens; and how many
    tokens were cut. Only the assistant's tokens are in the loss mask."""
    sequences, masks, tokens_cut = [], [], 0
    for conversation in conversations:
        episode = layout.start(conversation[0].content, tools)
        for message in conversation[1:]:
            if message.role == "assistant":
                layout.add_demonstrated(episode, message.content, tool_calls=[
                    {"name": call.name, "arguments": call.arguments} for call in message.tool_calls])
            else:
                layout.add_messages(episode, [{"role": message.role, "content": message.content}])
        tokens_cut += max(0, len(episode) - max_len)
        sequences.append(episode.token_ids[:max_len])
        masks.append(episode.loss_mask[:max_len])
    return sequences, masks, tokens_cut


class SFTMix:
    """Which source each example of an SFT step comes from, and the dataset examples themselves."""

    def __init__(self, *, run_seed: int, batch_size: int, datasets: Sequence[DatasetSource],
                 demonstrations_weight: float):
        self.run_seed = run_seed
        self.batch_size = batch_size
        self.datasets = tuple(datasets)
        self.demonstrations_weight = demonstrations_weight
        # Sources with a weight, datasets first, then the demonstrations (index len(datasets)).
        self._weights = [dataset.weight for dataset in self.datasets] + [demonstrations_weight]

    @classmethod
    def for_config(cls, sft: SFTConfig, *, run_seed: int, batch_size: int,
                   datasets: Sequence[DatasetSource]) -> SFTMix:
        """Raises DatasetHasNoRowsError for a dataset whose every row is held out."""
        for dataset in datasets:
            if not dataset.rows:
                raise DatasetHasNoRowsError(
                    f"dataset {dataset.label} has no training rows: all {len(dataset.held_out_rows)} are "
                    "held out for evaluation (metadata.split); SFT cannot train on it")
        return cls(run_seed=run_seed, batch_size=batch_size, datasets=datasets,
                   demonstrations_weight=sft.effective_demonstrations_weight)

    def _rng(self, step: int) -> random.Random:
        # Apart from the demonstrations' seed (trainer.demonstrations.demonstration_seed).
        return random.Random(f"{self.run_seed}:{step}:sft-mix")

    def counts(self, step: int) -> list[int]:
        """Examples of SFT ``step`` (0-based) per source: each dataset's, then the demonstrations'."""
        counts = [0] * len(self._weights)
        for source in self._rng(step).choices(range(len(self._weights)), weights=self._weights, k=self.batch_size):
            counts[source] += 1
        return counts

    def dataset_examples(self, step: int, counts: Sequence[int]) -> list[list[DemonstrationMessage]]:
        """The datasets' examples of ``step``, ``counts[i]`` drawn from dataset i."""
        rng = self._rng(step)
        rng.random()  # not the draws of counts(): a stream of its own
        examples = []
        for dataset, count in zip(self.datasets, counts, strict=False):
            examples.extend(list(row) for row in rng.choices(dataset.rows, k=count))
        return examples

    def metrics(self, counts: Sequence[int], *, demonstrations_used: int) -> dict[str, float]:
        """The step's examples per source, as SFT step metrics (``sft/rows/<index>``, ``sft/rows/demonstrations``)."""
        values = {dataset_rows_metric(index): float(count)
                  for index, count in enumerate(counts[:len(self.datasets)])}
        if self.demonstrations_weight > 0:
            values[DEMONSTRATIONS_ROWS_METRIC] = float(demonstrations_used)
        return values
