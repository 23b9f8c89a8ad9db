"""The dataset upload path fuzzed with Hypothesis on PostgreSQL (issue 28): generated JSONL files
holding lone surrogates, NUL, invalid UTF-8, huge numbers, NaN and deep nesting never get a 5xx;
each refusal names its field (and line), and each accepted file is stored by the datasets worker's
service into rows that every page and API then serves."""

from __future__ import annotations

import itertools
import json

import pytest
from django.test import Client
from hypothesis import HealthCheck, event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from dataset_registry.models import DatasetVersion
from dataset_registry.services import dataset_version_store

from .test_datasets_api import dataset_media_root  # noqa: F401 - the fixture, used by name

pytestmark = pytest.mark.django_db

_names = itertools.count()

# Text of every kind, lone surrogates and NUL among it.
_hostile_text = st.one_of(
    st.text(st.characters(codec=None, categories=None), max_size=12),
    st.sampled_from(["x\ud800y", "\udfff", "a\x00b", "\x00", "é", "\ue000", ""]),
)
_numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", "9" * 5000]),  # written as they are, not as JSON strings
)


def _value(depth: int):
    leaves = st.one_of(_hostile_text, _numbers, st.booleans(), st.none())
    if depth == 0:
        return leaves
    return st.one_of(leaves, st.lists(_value(depth - 1), max_size=3),
                     st.dictionaries(_hostile_text, _value(depth - 1), max_size=3))


def _write(value) -> str:
    """JSON as a hostile client writes it: bare NaN and huge literals, escapes or raw surrogates."""
    if isinstance(value, str) and value in ("1e400", "-1e400", "NaN", "Infinity") or (
            isinstance(value, str) and value and set(value) == {"9"}):
        return value
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(key)}: {_write(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_write(item) for item in value) + "]"
    return json.dumps(value)


@st.composite
def _line(draw, kinds=("clean", "row", "row", "deep", "bytes", "raw_surrogate")) -> bytes:
    kind = draw(st.sampled_from(kinds))
    if kind == "deep":
        depth = draw(st.integers(min_value=30, max_value=3000))
        return b'{"messages": [], "metadata": {"x": ' + b"[" * depth + b"]" * depth + b"}}"
    if kind == "bytes":
        return draw(st.binary(max_size=40)).replace(b"\n", b" ")
    if kind == "clean":  # a storable row with any text and numbers, so that storing is fuzzed too
        text = st.text(max_size=12).filter(lambda value: "\x00" not in value)
        return json.dumps({"messages": [{"role": "user", "content": draw(text)},
                                        {"role": "assistant", "content": draw(text)}],
                           "metadata": {draw(text): draw(st.one_of(st.integers(), text, st.floats(allow_nan=False,
                                                                                                 allow_infinity=False)))}},
                          ensure_ascii=draw(st.booleans())).encode()
    content = draw(_hostile_text)
    messages = [{"role": draw(st.sampled_from(["user", "system"])), "content": draw(_hostile_text)},
                {"role": "user", "content": content}, {"role": "assistant", "content": draw(_hostile_text)}]
    if draw(st.booleans()):
        messages[2]["tool_calls"] = [{"name": draw(_hostile_text), "arguments": draw(_value(2))}]
    row = {"messages": messages, "metadata": draw(st.dictionaries(_hostile_text, _value(2), max_size=3))}
    text = _write(row)
    if kind == "raw_surrogate":  # a surrogate written as UTF-8 bytes would be: invalid UTF-8
        return text.encode("utf-8", errors="surrogatepass") + "\"\ud800\"".encode("utf-8", "surrogatepass")
    return text.encode("utf-8", errors="surrogatepass")


BOUNDARY = "fuzzboundary7f3a"


def _multipart(fields: dict[str, bytes], file: bytes, filename: bytes = b"fuzz.jsonl") -> bytes:
    """A multipart body written byte by byte, so that a field may hold invalid UTF-8 as a hostile client's can."""
    parts = [b"--%s\r\nContent-Disposition: form-data; name=\"%s\"\r\n\r\n%s\r\n" % (
        BOUNDARY.encode(), key.encode(), value) for key, value in fields.items()]
    parts.append(b"--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"%s\"\r\n"
                 b"Content-Type: application/jsonl\r\n\r\n%s\r\n" % (BOUNDARY.encode(), filename, file))
    return b"".join(parts) + b"--%s--\r\n" % BOUNDARY.encode()


@hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                             HealthCheck.too_slow])
@given(lines=st.one_of(st.lists(_line(kinds=("clean",)), min_size=1, max_size=4), st.lists(_line(), max_size=4)),
       name=st.one_of(st.just("fuzz"), st.just("fuzz"), _hostile_text),
       filename=st.one_of(st.just("fuzz.jsonl"), _hostile_text.map(lambda text: text.replace('"', "") + ".jsonl")))
def test_no_generated_upload_gets_a_server_error(api, user, project, dataset_media_root, settings,  # noqa: F811
                                                 lines, name, filename):
    settings.TANDEM_DATASET_PROJECT_MAX_VERSIONS = 10**6  # every example is a version of one project
    name = name if name != "fuzz" else f"fuzz-{next(_names)}"
    body = _multipart({"project": str(project.pk).encode(), "name": name.encode("utf-8", "surrogatepass")},
                      b"\n".join(lines), filename.encode("utf-8", "surrogatepass").replace(b"\r", b"").replace(b"\n", b""))
    response = api.post("/api/datasets/", data=body, content_type=f"multipart/form-data; boundary={BOUNDARY}")

    assert response.status_code < 500, response.content
    event(f"answered {response.status_code}")
    if response.status_code == 400:
        fields = response.json()["error"]["fields"]
        assert fields and set(fields) <= {"file", "name"}, fields
        # A row's error names its line (and its field, when it has one).
        for message in fields.get("file", ()):
            assert message.startswith("line ") or "file" in message.lower(), message
        return
    assert response.status_code == 202, response.content
    version = DatasetVersion.objects.get(pk=response.json()["latest_version"]["id"])
    dataset_version_store(version_id=version.pk)
    version.refresh_from_db()
    assert version.status == "ready", version.failure_reason
    base = f"/api/datasets/{version.dataset_id}"
    rows = api.get(f"{base}/versions/{version.number}/rows/")
    assert rows.status_code == 200 and len(rows.json()["rows"]) == version.row_count
    browser = Client()
    browser.force_login(user)
    assert browser.get(f"/datasets/{version.dataset_id}/").status_code == 200
    assert browser.get("/datasets/").status_code == 200
