"""Settings shared by every environment: Django core, database, templates and static files.

DRF, Channels and Celery settings live in their own modules, imported at the end.
"""

from pathlib import Path

import dj_database_url

from .env_vars import REDIS_URL, REPO_ROOT, env_bool, env_list, env_str

SECRET_KEY = env_str("DJANGO_SECRET_KEY", "insecure-dev-key-change-me-tandem")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1"])
# Behind a TLS proxy on another host name, form posts need its origin, e.g. https://tandem.example.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "common",
    "accounts",
    "environment_registry",
    "runs",
    "telemetry",
    "trajectories",
    "checkpoints",
    "dataset_registry",
    "evaluations",
    "run_logs",
    "alerts",
    "sweeps",
    "workspaces",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Right after SecurityMiddleware, so static files skip the session and auth work.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [REPO_ROOT / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Default: a SQLite file under var/ so `manage.py` works with no database server.
_DEFAULT_SQLITE = REPO_ROOT / "var" / "tandem.sqlite3"
DATABASES = {
    "default": dj_database_url.config(
        env="DATABASE_URL",
        default=f"sqlite:///{_DEFAULT_SQLITE}",
        # Persistent connections are unsafe under ASGI (each request may run on a
        # different thread), so connections close at the end of each request.
        conn_max_age=0,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    _DEFAULT_SQLITE.parent.mkdir(parents=True, exist_ok=True)
    DATABASES["default"].setdefault("OPTIONS", {}).update({
        # Web, platform worker and beat all write to the one file. A deferred transaction that
        # reads and then writes fails at once with "database is locked" when another writer got
        # there first (SQLite cannot wait there without deadlocking); IMMEDIATE takes the write
        # lock at BEGIN, where the busy timeout does wait.
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        # Readers no longer wait for a writer, nor block it.
        "init_command": "PRAGMA journal_mode=WAL;",
    })

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Counts failed passwords and refuses locked-out names on every login path (the admin's too).
AUTHENTICATION_BACKENDS = ["accounts.backends.LockingModelBackend"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "run-list-page"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [REPO_ROOT / "frontend" / "static"]
# Uploaded files (profiler traces of runs) live with the platform's other state under var/.
MEDIA_ROOT = Path(env_str("TANDEM_MEDIA_ROOT", str(REPO_ROOT / "var" / "media")))
# Traces are served by the API's own download view (with permission checks), never as public media.
MEDIA_URL = "/media/"

# No STATIC_ROOT: WhiteNoise serves straight from the finders, so there is no collectstatic step.
WHITENOISE_USE_FINDERS = True

# Shared by every web process: failed-login counters must add up across them (accounts.services).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "tandem:cache",
    }
}
# Failed logins and unknown API tokens allowed per user name and per client address within
# the window; past them, logins and token requests from there get 429 until it ends.
TANDEM_AUTH_FAILURES_ALLOWED = int(env_str("TANDEM_AUTH_FAILURES_ALLOWED", "10"))
TANDEM_AUTH_FAILURE_WINDOW_S = int(env_str("TANDEM_AUTH_FAILURE_WINDOW_S", "900"))

from .alerts import *  # noqa: E402,F403
from .api import *  # noqa: E402,F403
from .celery import *  # noqa: E402,F403
from .datasets import *  # noqa: E402,F403
from .environment_registry import *  # noqa: E402,F403
from .realtime import *  # noqa: E402,F403
from .request_limits import *  # noqa: E402,F403
from .run_logs import *  # noqa: E402,F403
from .runs import *  # noqa: E402,F403
from .telemetry import *  # noqa: E402,F403
