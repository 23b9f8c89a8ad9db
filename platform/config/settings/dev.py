"""Local development: debug on, loopback host names only, SQLite unless DATABASE_URL says otherwise."""

import os
from pathlib import Path

from tandem.runtime.secrets_at_rest import (
    SECRETS_KEY_ENV,
    SECRETS_KEY_FILE_ENV,
    secrets_key_file_ensure,
)

from .env_vars import REPO_ROOT, env_bool, env_list

# Secret settings at rest need a key (TANDEM_SECRETS_KEYS): a developer's is written on first
# start, before base.py reads it. `tandem up` hands its own to every process that needs it.
if not os.environ.get(SECRETS_KEY_ENV):
    os.environ.setdefault(SECRETS_KEY_FILE_ENV, str(REPO_ROOT / "var" / "secrets.key"))
    secrets_key_file_ensure(Path(os.environ[SECRETS_KEY_FILE_ENV]))

from .base import *  # noqa: E402,F403

DEBUG = env_bool("DJANGO_DEBUG", True)
# Loopback names only, unless ALLOWED_HOSTS says otherwise: with any host allowed, a web page
# whose name resolves to 127.0.0.1 (DNS rebinding) could drive a developer's local stack.
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
# Pick up edits to static files without restarting the server.
WHITENOISE_AUTOREFRESH = DEBUG
