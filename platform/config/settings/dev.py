"""Local development: debug on, loopback host names only, SQLite unless DATABASE_URL says otherwise."""

from .base import *  # noqa: F403
from .env_vars import env_bool, env_list

DEBUG = env_bool("DJANGO_DEBUG", True)
# Loopback names only, unless ALLOWED_HOSTS says otherwise: with any host allowed, a web page
# whose name resolves to 127.0.0.1 (DNS rebinding) could drive a developer's local stack.
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
# Pick up edits to static files without restarting the server.
WHITENOISE_AUTOREFRESH = DEBUG
