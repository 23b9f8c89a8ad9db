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


def config_tree(config: dict, defaults: dict) -> list[dict]:
    """``config`` as rows to read top to bottom: ``{path, key, depth, value, default, changed}`` in the
    config's own order, a section a row of its own (``value`` None) above its fields, a leaf's value and
    default as JSON text (``default`` None where ``defaults`` lacks it, e.g. a section off by default),
    and ``changed`` where a leaf differs from its default or a section holds one that does."""
    rows: list[dict] = []

    def walk(node: dict, default_node: object, prefix: str, depth: int) -> bool:
        any_changed = False
        for key, value in node.items():
            path = f"{prefix}{key}"
            default = default_node.get(key, _ABSENT) if isinstance(default_node, dict) else _ABSENT
            if isinstance(value, dict) and value:
                row = {"path": path, "key": key, "depth": depth, "value": None, "default": None, "changed": False}
                rows.append(row)
                row["changed"] = walk(value, default, f"{path}.", depth + 1) or not isinstance(default, dict)
            else:
                changed = default is _ABSENT or value != default
                rows.append({"path": path, "key": key, "depth": depth, "value": json.dumps(value, sort_keys=True),
                             "default": None if default is _ABSENT else json.dumps(default, sort_keys=True),
                             "changed": changed})
                row = rows[-1]
            any_changed = any_changed or row["changed"]
        return any_changed

    walk(config, defaults, "", 0)
    return rows
