"""The SFT phase's data: uploaded dataset versions and the environment's demonstrations, mixed by weight.

A run's config pins dataset versions (``sft.datasets``, each with a weight)
and the weight of the environment's demonstrations
(``sft.demonstrations_weight``). The trainer reads each pinned version's rows
over the platform's trainer API before SFT starts (it has no database), as
chat messages (:func:`tandem.contracts.stored_row_messages`), with their tool
calls written in the run's own tool-call format, so that they render exactly
as a producer's demonstrations do.

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
from tandem.contracts import DATASET_ROWS_PAGE_MAX, DemonstrationMessage, stored_row_messages
from tandem.sft_config import SFTConfig
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


@dataclass(frozen=True)
class DatasetSource:
    """One pinned dataset version's rows, ready to render."""

    name: str
    version: int
    weight: float
    rows: tuple[tuple[DemonstrationMessage, ...], ...]

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"


def load_dataset(platform: PlatformClient, run_id: int, *, name: str, version: int, weight: float,
                 tool_call_format: str, between_pages: Callable[[], None] = lambda: None,
                 page_size: int = DATASET_ROWS_PAGE_MAX) -> DatasetSource:
    """Every row of ``name@version`` from the platform, page by page; ``between_pages`` runs after each."""
    rows: list[tuple[DemonstrationMessage, ...]] = []
    while True:
        page = platform.dataset_rows(run_id, name, version, offset=len(rows), limit=page_size)
        rows.extend(tuple(with_written_calls(stored_row_messages(row), tool_call_format)) for row in page.rows)
        between_pages()
        if not page.rows or len(rows) >= page.total:
            break
    return DatasetSource(name=name, version=version, weight=weight, rows=tuple(rows))


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
