"""Text a model or an environment produced, stored losslessly although PostgreSQL cannot hold all of it.

PostgreSQL's text and jsonb hold no NUL character, and UTF-8 holds no lone surrogate
(``"\\ud800"`` in JSON), yet an untrained model emits NUL bytes and an environment may answer
anything. Such text is not refused (it is what happened, and a trajectory sample of it is what
people need to see): it is escaped on store and unescaped, exactly, on read.

The escape: NUL, every surrogate code point, and the escape character itself (U+E000, of the
private use area, which no text means anything by) become U+E000 followed by the character's
four lower-case hex digits. Every other text is stored as it is, so stored text stays readable
and searchable. ``text_unescape(text_escape(s)) == s`` for every ``s``
(tests/platform/test_stored_text.py proves it with Hypothesis).
"""

from __future__ import annotations

import re
from typing import Any

ESCAPE = "\ue000"
_NEEDS_ESCAPE = re.compile("[\x00\ud800-\udfff\ue000]")
_ESCAPED = re.compile("\ue000([0-9a-f]{4})")
# What a web page shows for what it cannot hold: NUL as the control picture ␀, a lone surrogate as
# the escape JSON writes for it.
_NOT_FOR_PAGES = re.compile("[\x00\ud800-\udfff]")


def text_escape(text: str) -> str:
    """``text`` as it is stored: with no NUL and no surrogate, valid UTF-8 that PostgreSQL holds."""
    if _NEEDS_ESCAPE.search(text) is None:
        return text
    return _NEEDS_ESCAPE.sub(lambda match: f"{ESCAPE}{ord(match.group()):04x}", text)


def text_unescape(stored: str) -> str:
    """The exact inverse of :func:`text_escape`."""
    if ESCAPE not in stored:
        return stored
    return _ESCAPED.sub(lambda match: chr(int(match.group(1), 16)), stored)


def text_for_page(text: str) -> str:
    """``text`` (unescaped) as an HTML page can show it: NUL as ␀, a lone surrogate as ``\\udXXX``."""
    if _NOT_FOR_PAGES.search(text) is None:
        return text
    return _NOT_FOR_PAGES.sub(lambda match: "\u2400" if match.group() == "\x00" else f"\\u{ord(match.group()):04x}",
                              text)


def json_text_map(value: Any, text_map) -> Any:
    """``value`` (decoded JSON) with ``text_map`` applied to every string in it, object keys included."""
    if isinstance(value, str):
        return text_map(value)
    if isinstance(value, dict):
        return {text_map(key): json_text_map(item, text_map) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_text_map(item, text_map) for item in value]
    return value


def json_text_escape(value: Any) -> Any:
    return json_text_map(value, text_escape)


def json_text_unescape(value: Any) -> Any:
    return json_text_map(value, text_unescape)
