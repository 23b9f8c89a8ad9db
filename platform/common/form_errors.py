"""Where a service's error shows on a dashboard form: next to the input it names, or above the form.

Services raise :class:`~common.domain_errors.DomainError` with ``fields`` keyed by
dotted paths (``config.model.num_heads``, ``settings.url``); every form of the
dashboard places those messages by the one rule of :func:`error_placements`.
"""

from __future__ import annotations

from collections.abc import Mapping

from django import forms

from common.domain_errors import DomainError

# What InvalidInput.from_pydantic names an error of the whole object by.
_WHOLE_OBJECT = ("", "non_field_errors")


def error_placements(error: DomainError, *, inputs: Mapping[str, str]) -> list[tuple[str | None, str]]:
    """Each of ``error``'s messages with the input it shows at; None is above the form.

    ``inputs`` maps an error path to the input that shows it, e.g.
    ``{"config.rl_steps": "rl_steps"}``. A path inside an input's value
    (``settings.url`` under ``settings``, a list item ``config.sampling.stop_strings.0``
    under ``sampling.stop_strings``) shows at the input of its longest such prefix. A
    message names its path unless its input shows exactly that path; one about
    the whole object, or an error that names no field, is shown as it is.
    """
    if not error.fields:
        return [(None, error.message)]
    placed: list[tuple[str | None, str]] = []
    for path, messages in error.fields.items():
        prefix = path
        while prefix not in inputs and "." in prefix:
            prefix = prefix.rsplit(".", 1)[0]
        input_name = inputs.get(prefix)
        plain = prefix == path and (input_name is not None or path in _WHOLE_OBJECT)
        placed.extend((input_name, message if plain else f"{path}: {message}") for message in messages)
    return placed


class DomainErrorForm(forms.Form):
    """A form whose fields show the service errors about them (``add_domain_error``).

    By default an error path names a field by its own name; a form whose fields
    stand for other paths (``config.rl_steps``) says so in :meth:`error_inputs`.
    """

    def error_inputs(self) -> dict[str, str]:
        return {name: name for name in self.fields}

    def add_domain_error(self, error: DomainError) -> None:
        for input_name, message in error_placements(error, inputs=self.error_inputs()):
            self.add_error(input_name, message)
