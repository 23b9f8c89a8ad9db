"""JSON input checked once, as it is parsed, for what the platform cannot store or walk.

Every JSON body the API parses (``StrictJSONParser``, the default parser) and every JSON
a form takes (environment_registry.forms) is refused with a 400 naming the field path
(``settings.a.b``) when it holds

- objects or arrays nested deeper than ``MAX_JSON_DEPTH`` (Python's own parser and every
  recursive walk of the value would otherwise end in a RecursionError);
- a number that is not finite: ``NaN``, ``Infinity``, or one too large for a float (``1e400``),
  which jsonb cannot hold;
- a NUL character or a lone surrogate (``"\\u0000"``, ``"\\ud800"``), in a key or a string,
  which PostgreSQL's text and jsonb cannot hold.

Routes whose bodies carry a model's or an environment's output (the trainer's trajectory
samples) take ``ModelOutputJSONParser``: NUL and surrogates pass, and the service stores them
escaped (common/stored_text.py).
"""

from __future__ import annotations

import codecs
import json
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from common.domain_errors import InvalidInput
from tandem.contracts.json_values import json_value_problem

# Deepest nesting of objects and arrays accepted. Run configs, environment settings and tools'
# JSON schemas nest a few levels; Python's parser gives up near 1000.
MAX_JSON_DEPTH = 64


def json_input_problem(value: Any, *, root: str = "", allow_nul: bool = False, allow_surrogates: bool = False,
                       allow_non_finite: bool = False) -> tuple[str, str] | None:
    """``(field path, message)`` of the first thing in ``value`` the platform refuses, or None.

    The walk is :func:`tandem.contracts.json_values.json_value_problem` (no recursion, any depth);
    this words what it finds for the API, under ``root``.
    """
    problem = json_value_problem(value, max_depth=MAX_JSON_DEPTH, allow_nul=allow_nul,
                                 allow_surrogates=allow_surrogates, allow_non_finite=allow_non_finite)
    if problem is None:
        return None
    path = ".".join((root, *problem.path) if root else problem.path) or "non_field_errors"
    if problem.kind == "depth":
        return path, f"Nested deeper than {MAX_JSON_DEPTH} levels."
    if problem.kind == "non_finite":
        return path, f"{problem.found} is not a finite number (JSON has no NaN or Infinity)."
    if problem.kind == "nul":
        message = "The text holds a NUL character (\\u0000), which cannot be stored."
    else:
        message = f"The text holds a lone surrogate (\\u{ord(problem.found):04x}), which is not valid UTF-8."
    return path, f"Its name: {message}" if problem.in_key else message


def json_input_refuse(value: Any, *, root: str = "", **allowed: bool) -> Any:
    """``value``, or :class:`InvalidInput` naming the first field it cannot be stored with."""
    problem = json_input_problem(value, root=root, **allowed)
    if problem is not None:
        raise InvalidInput.for_field(*problem)
    return value


def json_input_loads(text: str | bytes, *, root: str = "", **allowed: bool) -> Any:
    """``text`` parsed and checked (:func:`json_input_problem`); ``ValueError`` if it is not JSON."""
    try:
        # NaN and Infinity are parsed, then refused by the check with their field's path.
        value = json.loads(text)
    except RecursionError:
        raise InvalidInput.for_field(root or "non_field_errors",
                                     f"Nested deeper than {MAX_JSON_DEPTH} levels.") from None
    return json_input_refuse(value, root=root, **allowed)


class StrictJSONParser(JSONParser):
    """The API's JSON parser: DRF's, with the checks of :func:`json_input_problem`."""

    allow_nul = False
    allow_surrogates = False
    allow_non_finite = False

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.getreader(encoding)(stream).read()
        except ValueError as error:  # not in the declared encoding
            raise ParseError(f"JSON parse error - {error}") from None
        try:
            return json_input_loads(text, allow_nul=self.allow_nul, allow_surrogates=self.allow_surrogates,
                                    allow_non_finite=self.allow_non_finite)
        except json.JSONDecodeError as error:
            raise ParseError(f"JSON parse error - {error}") from None


class ModelOutputJSONParser(StrictJSONParser):
    """For bodies of a model's or an environment's output: NUL and lone surrogates pass, to be stored
    escaped (common/stored_text.py); depth and non-finite numbers are still refused."""

    allow_nul = True
    allow_surrogates = True
