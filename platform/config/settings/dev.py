"""Local development: debug on, any host, SQLite unless DATABASE_URL says otherwise."""

from .base import *  # noqa: F403
from .env_vars import env_bool, env_list

DEBUG = env_bool("DJANGO_DEBUG", True)
# The dev server is reached by whatever name the developer's browser uses.
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["*"])
# Pick up edits to static files without restarting the server.
WHITENOISE_AUTOREFRESH = DEBUG
