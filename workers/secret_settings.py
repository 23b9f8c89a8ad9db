"""An environment's secret settings inside a worker: given to its constructor, kept out of what leaves.

The platform hands them to producers (a run's EnvironmentSecrets in Redis) and probes
(the ProbeRequest); the trainer and users never get them. What a worker sends back, a
probe's check messages and an episode's failure reason, is shown to every viewer of the
project, and an environment's error may quote the key it was given ("invalid API key
sk-..."), so those texts have the values replaced by the setting's name: in every form an error
echoes a value in (``echoed_forms``), not only the raw one.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

# Escapings of escapings are echoed too (the repr of an error whose text holds a JSON body);
# a third level is rare, and each costs a replace per form.
_ESCAPING_DEPTH = 2


def echoed_forms(value: str) -> set[str]:
    """``value`` as a message may quote it: raw, and as repr(), ascii(), json.dumps() and
    URL-quoting write it, each inside a larger text, and the escapings of those escapings.

    A JSON service-account key (quotes, backslashes, newlines) differs in each, so replacing
    only the raw value let ``f"{key!r}"`` or a JSON request body through.
    """
    forms = {value}
    for _ in range(_ESCAPING_DEPTH):
        forms |= {escaped for form in forms for escaped in _escapings(form)}
    return {form for form in forms if form}


def _escapings(value: str) -> Iterator[str]:
    for python in (repr(value)[1:-1], ascii(value)[1:-1]):
        yield python
        if "'" in value and '"' not in value:
            # repr() of the value alone quotes it with ", leaving ' bare; inside a text that also
            # holds a ", repr() quotes with ' and writes each ' of the value as \'.
            yield python.replace("'", "\\'")
    yield json.dumps(value)[1:-1]
    yield json.dumps(value, ensure_ascii=False)[1:-1]
    yield urllib.parse.quote(value, safe="")
    yield urllib.parse.quote(value)
    yield urllib.parse.quote_plus(value, safe="")


class SecretSettings:
    """Secret settings of one environment version: name -> value."""

    def __init__(self, values: Mapping[str, str] | None = None):
        self._values = dict(values or {})
        # Longest first, so a form that contains another (of this value or another) is replaced whole.
        self._forms = sorted(((form, name) for name, value in self._values.items() if value
                              for form in echoed_forms(value)), key=lambda item: -len(item[0]))

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
        """``text`` with every secret value, in each of its ``echoed_forms``, replaced by ``[secret <name>]``."""
        for form, name in self._forms:
            text = text.replace(form, f"[secret {name}]")
        return text
