"""Cells of the CSV files the platform serves, safe to open in a spreadsheet."""

from __future__ import annotations


def spreadsheet_safe(value):
    """A text cell a spreadsheet would run as a formula (=, +, -, @), quoted so it stays text."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value
