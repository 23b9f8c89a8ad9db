"""Changes to a nested config, given as a partial dict of the same shape.

A run's config changed for a clone, a config file overridden by ``--set``, an
environment's settings over its defaults: each takes a partial dict that merges
key by key, nested sections too, so ``{"algorithm": {"epsilon_high": 0.3}}``
keeps every other algorithm setting.
"""

from __future__ import annotations

from typing import Any


def merge_changes(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in; a dict merges into a dict, any other value replaces.

    Neither argument is modified.
    """
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_changes(merged[key], value)
        else:
            merged[key] = value
    return merged
