"""A sweep's search space: {config path: distribution} as Optuna's distributions, its grid, and a trial's
config."""

from __future__ import annotations

import math
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from common.domain_errors import InvalidInput
from tandem.configs.changes import merge_changes

from .models import Sweep

#: Dimensions of a search space at most.
MAX_DIMENSIONS = 20
DISTRIBUTION_TYPES = ("float", "int", "categorical")


def search_space_distributions(search_space: Any, *, sampler: str) -> dict[str, BaseDistribution]:
    """Optuna's distributions of ``search_space`` ({config path: {"type": "float" | "int", "low", "high",
    "log"?, "step"?} | {"type": "categorical", "choices": [...]}}); InvalidInput naming the entry that is
    wrong. A grid needs every dimension finite: categorical, or an int or float with a ``step``."""
    if not isinstance(search_space, dict) or not search_space:
        raise InvalidInput.for_field("search_space", "An object of config paths to distributions, e.g. "
                                     '{"learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3, "log": true}}.')
    if len(search_space) > MAX_DIMENSIONS:
        raise InvalidInput.for_field("search_space", f"At most {MAX_DIMENSIONS} dimensions.")
    distributions = {}
    for path, spec in search_space.items():
        field = f"search_space.{path}"
        if not isinstance(spec, dict) or spec.get("type") not in DISTRIBUTION_TYPES:
            raise InvalidInput.for_field(field, f"A distribution: an object whose type is one of "
                                                f"{', '.join(DISTRIBUTION_TYPES)}.")
        unknown = set(spec) - {"type", "low", "high", "log", "step", "choices"}
        if unknown:
            raise InvalidInput.for_field(field, f"Unknown keys {sorted(unknown)}.")
        try:
            if spec["type"] == "categorical":
                choices = spec.get("choices")
                if not isinstance(choices, list) or not choices:
                    raise ValueError("a categorical dimension needs a non-empty list of choices")
                if not all(choice is None or isinstance(choice, str | int | float) for choice in choices):
                    raise ValueError("its choices are strings, numbers, booleans or null")
                distribution = CategoricalDistribution(choices)
            else:
                bounds = [spec.get(key) for key in ("low", "high", "step") if spec.get(key) is not None]
                if any(isinstance(bound, bool) or not isinstance(bound, int | float) or not math.isfinite(bound)
                       for bound in bounds):
                    raise ValueError("low, high and step are finite numbers")
                kind = FloatDistribution if spec["type"] == "float" else IntDistribution
                step = spec.get("step")
                distribution = kind(spec["low"], spec["high"], log=bool(spec.get("log", False)),
                                    **({"step": step} if step is not None else {}))
        except (KeyError, TypeError, ValueError) as error:
            detail = f"it needs {error}" if isinstance(error, KeyError) else str(error)
            raise InvalidInput.for_field(field, f"Not a valid {spec['type']} distribution: {detail}.") from None
        if sampler == Sweep.Sampler.GRID and _grid_values(distribution) is None:
            raise InvalidInput.for_field(field, "A grid sweep needs finite values here: choices, or a step.")
        distributions[path] = distribution
    return distributions


def _grid_values(distribution: BaseDistribution) -> list | None:
    if isinstance(distribution, CategoricalDistribution):
        return list(distribution.choices)
    step = getattr(distribution, "step", None)
    if step is None:
        return None
    count = int(round((distribution.high - distribution.low) / step)) + 1
    return [distribution.low + index * step for index in range(count)]


def grid(distributions: dict[str, BaseDistribution]) -> dict[str, list]:
    return {path: _grid_values(distribution) for path, distribution in distributions.items()}


def trial_config(base_config: dict, params: dict[str, Any]) -> dict:
    """``base_config`` with each of ``params`` ({dotted config path: value}) set."""
    changes: dict[str, Any] = {}
    for path, value in params.items():
        node = changes
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return merge_changes(base_config, changes)
