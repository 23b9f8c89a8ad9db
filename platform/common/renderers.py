"""The API's JSON renderer: DRF's, and text UTF-8 cannot hold written as JSON escapes it.

DRF writes JSON as UTF-8 (``UNICODE_JSON``), which cannot hold a lone surrogate (``"\\ud800"``):
an answer holding one, such as a model's text read back exactly (common/stored_text.py), would
be a 500. That answer is written with JSON's escapes instead, which every JSON reader decodes
to the same text.
"""

from __future__ import annotations

from rest_framework import renderers


class JSONRenderer(renderers.JSONRenderer):
    def render(self, data, accepted_media_type=None, renderer_context=None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            return _EscapingJSONRenderer().render(data, accepted_media_type, renderer_context)


class _EscapingJSONRenderer(renderers.JSONRenderer):
    ensure_ascii = True
