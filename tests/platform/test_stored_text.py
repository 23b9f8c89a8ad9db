"""The escape of a model's or an environment's text for PostgreSQL (common/stored_text.py)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from common.stored_text import (
    json_text_escape,
    json_text_unescape,
    text_escape,
    text_for_page,
    text_unescape,
)

# Any text, with what the escape is about (NUL, surrogates, the escape character and hex digits
# after it) drawn often, not once in a thousand.
TRICKY = st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff", "\ue000", "0", "a", "e", "f"])
ANY_TEXT = st.text(st.one_of(st.characters(codec=None, exclude_categories=()), TRICKY))


def _storable(text: str) -> bool:
    """What PostgreSQL's text and jsonb hold: valid UTF-8 without NUL."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


@given(ANY_TEXT)
def test_the_escape_is_undone_exactly_and_leaves_nothing_postgresql_refuses(text):
    stored = text_escape(text)

    assert text_unescape(stored) == text
    assert _storable(stored)


@given(st.text(st.characters(codec="utf-8", exclude_characters="\x00\ue000")))
def test_text_with_nothing_to_escape_is_stored_as_it_is(text):
    assert text_escape(text) == text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | ANY_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ANY_TEXT, children, max_size=4),
    max_leaves=20,
)


@given(JSON)
def test_a_payload_is_escaped_in_its_keys_and_strings_and_read_back_exactly(value):
    stored = json_text_escape(value)

    assert json_text_unescape(stored) == value
    # What Django writes for a JSONField, which PostgreSQL parses: no \u0000, no lone surrogate.
    assert _storable(json.dumps(stored, ensure_ascii=False))


def test_a_page_shows_nul_and_lone_surrogates_visibly():
    assert text_for_page("a\x00b\ud800c") == "a\u2400b\\ud800c"
    assert text_for_page("plain ✓") == "plain ✓"
