"""What differs between runs' configs, as flattened dotted keys (``rollout.group_size``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

_ABSENT = object()


def config_flatten(config: dict, prefix: str = "") -> dict[str, object]:
    """Every leaf of a config under its dotted key; a list is one leaf (its items have no names to key)."""
    flat: dict[str, object] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(config_flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def config_differences(configs: Sequence[dict]) -> list[dict]:
    """``[{key, values}]``, by key, for the keys whose value is not the same in every config.

    ``values`` has one entry per config, as JSON text, or None where that config lacks the key.
    """
    flats = [config_flatten(config) for config in configs]
    keys = sorted({key for flat in flats for key in flat})
    differences = []
    for key in keys:
        values = [flat.get(key, _ABSENT) for flat in flats]
        if all(value == values[0] for value in values[1:]):
            continue
        differences.append({"key": key, "values": [
            None if value is _ABSENT else json.dumps(value, sort_keys=True) for value in values]})
    return differences
