"""How an evaluation's label appears in the run's metric series names (``eval/<label>/<metric>``)."""

from __future__ import annotations

from tandem.contracts import DATASET_SERIES_LABEL_PREFIX, metric_series_label


def evaluation_series_label(*, kind: str, label: str) -> str:
    """The part of the series names of the evaluations of ``label`` between ``eval/`` and the metric:
    ``name@version``, or ``dataset:name@version`` for a dataset, cut with a hash past 32 characters
    (tandem.contracts.metric_series_label). The run page builds its live chart points' names from it."""
    return metric_series_label(f"{DATASET_SERIES_LABEL_PREFIX}{label}" if kind == "dataset" else label)
