"""The one walk of a JSON value for what a database cannot store or a recursive walk cannot reach.

Both places that take JSON from outside check it with :func:`json_value_problem`
before anything else reads it: the platform's API parsers and JSON form fields
(``platform/common/json_input.py``) and an SFT dataset's rows
(:func:`tandem.contracts.datasets.parse_dataset_line`). Each words the problem
its own way; what counts as one, and which is found first, is decided here once:

- an object or array nested at ``max_depth`` levels below the top or deeper;
- a number that is not finite (``NaN``, ``Infinity``, or a literal past 1.8e308),
  which jsonb cannot hold;
- a NUL character, or a lone surrogate (``\\ud800``; also how an invalid byte
  decoded with ``errors="surrogateescape"`` reads), in a string or a key, which
  PostgreSQL's text and jsonb cannot hold.

The value is walked in document order with a stack of its own (no recursion), so
a value of any depth is answered; an object's keys are checked before what it holds.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Literal

__all__ = ["JsonValueProblem", "json_value_problem"]

_NUL = "\x00"
_SURROGATE = re.compile("[\ud800-\udfff]")

JsonValueProblemKind = Literal["depth", "nul", "surrogate", "non_finite"]


@dataclasses.dataclass(frozen=True)
class JsonValueProblem:
    """The first thing in a JSON value that is refused.

    Attributes:
      path: the keys and array indices (as strings) from the top to the value;
        for a key, to the value the key names.
      kind: ``depth`` (a container at ``max_depth`` or deeper), ``nul``,
        ``surrogate`` (in a string or key) or ``non_finite`` (a float).
      in_key: the NUL or surrogate is in the object key at the end of ``path``.
      found: the refused character (``nul``, ``surrogate``) or number (``non_finite``);
        None for ``depth``.
    """

    path: tuple[str, ...]
    kind: JsonValueProblemKind
    in_key: bool = False
    found: Any = None


def _text_problem(text: str, *, allow_nul: bool, allow_surrogates: bool) -> tuple[JsonValueProblemKind, str] | None:
    if not allow_nul and _NUL in text:
        return "nul", _NUL
    found = None if allow_surrogates else _SURROGATE.search(text)
    if found is not None:
        return "surrogate", found.group()
    return None


def json_value_problem(
    value: Any,
    *,
    max_depth: int,
    allow_nul: bool = False,
    allow_surrogates: bool = False,
    allow_non_finite: bool = False,
) -> JsonValueProblem | None:
    """The first problem of ``value`` (as ``json.loads`` returns it) in document order, or None.

    ``max_depth``: a container whose path from the top is this long or longer is
    refused (the top is at 0). ``allow_*``: let NUL characters, lone surrogates or
    non-finite numbers pass.
    """
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            problem = _text_problem(item, allow_nul=allow_nul, allow_surrogates=allow_surrogates)
            if problem is not None:
                return JsonValueProblem(path=path, kind=problem[0], found=problem[1])
        elif isinstance(item, float):
            if not allow_non_finite and not math.isfinite(item):
                return JsonValueProblem(path=path, kind="non_finite", found=item)
        elif isinstance(item, dict | list):
            if len(path) >= max_depth:
                return JsonValueProblem(path=path, kind="depth")
            children = list(item.items() if isinstance(item, dict) else enumerate(item))
            for key, _ in children:
                if isinstance(key, str):
                    problem = _text_problem(key, allow_nul=allow_nul, allow_surrogates=allow_surrogates)
                    if problem is not None:
                        return JsonValueProblem(path=(*path, key), kind=problem[0], in_key=True, found=problem[1])
            stack.extend(((child, (*path, str(key))) for key, child in reversed(children)))
    return None
