"""An environment's secret settings inside a worker: given to its constructor, kept out of what leaves.

The platform hands them to producers (a run's EnvironmentSecrets in Redis) and probes
(the ProbeRequest); the trainer and users never get them. What a worker sends back, a
probe's check messages and an episode's failure reason, is shown to every viewer of the
project, and an environment's error may quote the key it was given ("invalid API key
sk-..."), so those texts have the values replaced by the setting's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SecretSettings:
    """Secret settings of one environment version: name -> value."""

    def __init__(self, values: Mapping[str, str] | None = None):
        self._values = dict(values or {})
        # Longest first, so a value that contains another is replaced whole.
        self._by_length = sorted(self._values.items(), key=lambda item: -len(item[1]))

    def __repr__(self) -> str:
        return f"SecretSettings({sorted(self._values)})"  # names only, in logs and tracebacks

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._values)

    def constructor_kwargs(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments an environment is built with: ``settings`` and the secret ones."""
        # The platform refuses a name that is both; the secret one wins all the same.
        return {**settings, **self._values}

    def redact(self, text: str) -> str:
        """``text`` with every secret value replaced by ``[secret <name>]``."""
        for name, value in self._by_length:
            if value:
                text = text.replace(value, f"[secret {name}]")
        return text
