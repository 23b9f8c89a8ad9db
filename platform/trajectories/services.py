"""Writes of trajectory samples: the trainer's posts."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction
from django.utils import timezone

from common.domain_errors import InvalidInput
from common.stored_text import json_text_escape, text_escape
from runs.models import Run
from tandem.contracts import TrajectorySample as TrajectorySampleRecord

from .models import TrajectorySample


def trajectory_search_text(sample: TrajectorySampleRecord) -> str:
    """What the browser's search matches: the turns' text, one turn a line (the spans' markup left out)."""
    return "\n".join(turn.text for turn in sample.turns)


def _tool_use_counts(sample: TrajectorySampleRecord) -> dict[str, int]:
    """What the browser's tool-use filter reads (selectors.TOOL_USE_FILTERS): calls that ran, and the turns
    whose call markup did not parse, or made no call that ran."""
    outcomes = sample.tool_call_outcomes()
    return {"tool_calls_run": sample.tool_calls_run(), "tool_calls_unparsed": outcomes.count("unparsed"),
            "tool_calls_failed": sum(outcome != "ok" for outcome in outcomes)}


@transaction.atomic
def trajectory_samples_record(*, run: Run, samples: Sequence[TrajectorySampleRecord]) -> int:
    """Store the samples of ``run``; a retried post stores each once, the newest copy winning.

    A trainer resumed from a checkpoint trains the steps after it again and may
    send the same trajectory with a later step: that step is the one kept.
    Returns how many samples the post carried.

    Every string is stored escaped (common/stored_text.py): a model's NUL bytes and lone
    surrogates are kept, not refused; ``stored_sample`` reads them back exactly.
    """
    for index, sample in enumerate(samples):
        if sample.run_id != run.pk:
            raise InvalidInput.for_field(
                f"samples.{index}.run_id",
                f"Sample is of run {sample.run_id}, posted to run {run.pk}.",
            )
    now = timezone.now()
    rows = {
        text_escape(sample.trajectory_id): TrajectorySample(
            run=run,
            trajectory_id=text_escape(sample.trajectory_id),
            step=sample.step,
            selected_because=sample.selected_because,
            purpose=sample.purpose,
            environment=text_escape(sample.environment),
            status=sample.status,
            failure_reason=text_escape(sample.failure_reason),
            reward=sample.reward,
            policy_version=sample.policy_version,
            num_turns=len(sample.policy_versions),
            num_tokens=sample.num_tokens,
            trained_tokens=sample.trained_tokens,
            group_id=text_escape(sample.group_id),
            group_size=sample.group_size,
            advantage=sample.advantage,
            search_text=text_escape(trajectory_search_text(sample)),
            **_tool_use_counts(sample),
            # Python's dump: JSON's would refuse a lone surrogate, which the escape keeps.
            payload=json_text_escape(sample.model_dump()),
            recorded_at=now,
        )
        for sample in samples
    }
    TrajectorySample.objects.bulk_create(
        rows.values(), update_conflicts=True, unique_fields=["run", "trajectory_id"],
        update_fields=["step", "selected_because", "purpose", "group_id", "group_size", "advantage", "search_text",
                       "tool_calls_run", "tool_calls_unparsed", "tool_calls_failed", "payload", "recorded_at"],
        batch_size=200,
    )
    return len(samples)
