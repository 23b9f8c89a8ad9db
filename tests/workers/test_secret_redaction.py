"""Issue 28, finding 10: SecretSettings.redact replaces every form a value is echoed in.

An environment's error quotes its key as its client library writes it: raw, through repr()
(str of a dict or an exception's args), json.dumps() (a request body), or URL-quoted (a query
string). A JSON service-account key differs in each, by its quotes, backslashes and newlines.
"""

from __future__ import annotations

import json
import urllib.parse

import pytest

from tests.workers.secret_environments import SERVICE_ACCOUNT_KEY, SERVICE_ACCOUNT_KEY_BODY
from workers.secret_settings import SecretSettings

SECRETS = SecretSettings({"credentials": SERVICE_ACCOUNT_KEY})


@pytest.mark.parametrize(("how", "echo"), [
    ("raw", lambda key: f"refused {key}"),
    ("repr", lambda key: f"refused {key!r}"),
    ("repr of a dict", lambda key: f"refused {({'credentials': key})!r}"),
    ("repr of a message that holds a single quote", lambda key: repr(f"it's {key}")),
    ("repr of a message that holds a double quote", lambda key: repr(f'say "{key}"')),
    ("ascii", lambda key: ascii(f"refused {key}é")),
    ("an exception's args", lambda key: repr(RuntimeError("refused", key))),
    ("json.dumps", lambda key: json.dumps({"credentials": key})),
    ("json.dumps, non-ASCII kept", lambda key: json.dumps({"credentials": f"{key}é"}, ensure_ascii=False)),
    ("json.dumps of a JSON dump", lambda key: json.dumps(json.dumps({"credentials": key}))),
    ("repr of a JSON dump", lambda key: repr(json.dumps({"credentials": key}))),
    ("URL-quoted", lambda key: f"https://auth.example/?key={urllib.parse.quote(key, safe='')}"),
    ("URL-quoted with plus", lambda key: urllib.parse.urlencode({"key": key})),
])
def test_every_echo_of_a_json_key_is_redacted(how, echo):
    text = echo(SERVICE_ACCOUNT_KEY)
    assert SERVICE_ACCOUNT_KEY_BODY in text  # the echo holds the key: the test means something

    redacted = SECRETS.redact(text)

    assert SERVICE_ACCOUNT_KEY_BODY not in redacted, f"{how}: {redacted}"
    assert "[secret credentials]" in redacted, how


def test_text_without_a_value_is_left_as_it_is():
    text = "step raised RuntimeError: 'timeout' after 2s\\n"

    assert SECRETS.redact(text) == text
    assert SecretSettings({"token": "abc'def"}).redact("no token here") == "no token here"


@pytest.mark.parametrize("message", ["refused {!r}", "say \"{}\" ({!r})"])
def test_a_value_with_a_single_quote_is_redacted_in_either_quoting_of_repr(message):
    value = "it's-a-token-8f3a2c"  # repr() alone quotes it with ", inside a text holding a " with '
    text = repr(message.format(value, value))

    assert "8f3a2c" not in SecretSettings({"token": value}).redact(text), text
