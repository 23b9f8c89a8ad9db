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
import math
import re
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from common.domain_errors import InvalidInput

# Deepest nesting of objects and arrays accepted. Run configs, environment settings and tools'
# JSON schemas nest a few levels; Python's parser gives up near 1000.
MAX_JSON_DEPTH = 64
_NUL = "\x00"
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_input_problem(value: Any, *, root: str = "", allow_nul: bool = False, allow_surrogates: bool = False,
                       allow_non_finite: bool = False) -> tuple[str, str] | None:
    """``(field path, message)`` of the first thing in ``value`` the platform refuses, or None.

    Walked with a stack of its own, so a value of any depth is walked without recursion.
    """

    def text_problem(text: str) -> str | None:
        if not allow_nul and _NUL in text:
            return "The text holds a NUL character (\\u0000), which cannot be stored."
        found = None if allow_surrogates else _SURROGATE.search(text)
        if found is not None:
            return f"The text holds a lone surrogate (\\u{ord(found.group()):04x}), which is not valid UTF-8."
        return None

    stack: list[tuple[Any, str, int]] = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        problem = None
        if isinstance(item, str):
            problem = text_problem(item)
        elif isinstance(item, float):
            if not allow_non_finite and not math.isfinite(item):
                problem = f"{item} is not a finite number (JSON has no NaN or Infinity)."
        elif isinstance(item, dict | list):
            if depth >= MAX_JSON_DEPTH:
                problem = f"Nested deeper than {MAX_JSON_DEPTH} levels."
            else:
                children = item.items() if isinstance(item, dict) else enumerate(item)
                for key, child in reversed(list(children)):
                    child_path = f"{path}.{key}" if path else str(key)
                    key_problem = text_problem(key) if isinstance(key, str) else None
                    if key_problem is not None:
                        return child_path, f"Its name: {key_problem}"
                    stack.append((child, child_path, depth + 1))
        if problem is not None:
            return path or "non_field_errors", problem
    return None


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
