"""Production: what docker-compose.yml runs. Refuses to start without its secrets and host names.

Behind a TLS-terminating proxy that sets ``X-Forwarded-Proto``. Everything an
operator must set comes from the environment (docs/deploy.md):
``DJANGO_SECRET_KEY``, ``ALLOWED_HOSTS``, ``DATABASE_URL``, ``REDIS_URL``, ``TANDEM_SECRETS_KEY``.
"""

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F403
from .base import SECRET_KEY, TANDEM_SECRETS_KEYS
from .env_vars import env_bool, env_list, env_str

# base.py's fallback key is public: it is in this repository.
_PUBLIC_KEYS = {"", "insecure-dev-key-change-me-tandem"}

if SECRET_KEY in _PUBLIC_KEYS or len(SECRET_KEY) < 32:
    raise ImproperlyConfigured(
        "config.settings.prod needs DJANGO_SECRET_KEY: a secret of at least 32 characters "
        "(python -c 'import secrets; print(secrets.token_urlsafe(48))')"
    )
if not TANDEM_SECRETS_KEYS:
    raise ImproperlyConfigured(
        "config.settings.prod needs TANDEM_SECRETS_KEY (or TANDEM_SECRETS_KEY_FILE, a file holding it): "
        "the Fernet key(s) environment secret settings are encrypted under, comma separated, the same in "
        "the platform's processes and the rollout workers (python -c 'from cryptography.fernet import "
        "Fernet; print(Fernet.generate_key().decode())'; docs/deploy.md, 'Secret settings key')"
    )
DEBUG = False
# Remote environments reach only the allow-list, public addresses and nothing private unless listed.
TANDEM_ENVIRONMENT_URL_REFUSE_PRIVATE = env_str("TANDEM_ENVIRONMENT_URL_PRIVATE", "refuse") != "allow"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [])
if not ALLOWED_HOSTS or "*" in ALLOWED_HOSTS:
    raise ImproperlyConfigured(
        "config.settings.prod needs ALLOWED_HOSTS: the host names the platform is served at, "
        "comma separated (not '*')"
    )

# TLS ends at the proxy, which says so in X-Forwarded-Proto.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
# The proxy's own health checks reach the web server over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^api/$"]
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = int(env_str("DJANGO_HSTS_SECONDS", str(365 * 24 * 3600)))
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", False)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Preloading HSTS commits the whole domain, subdomains included, for months: the operator's
# decision (DJANGO_HSTS_PRELOAD), not a default that `check --deploy` should nag about.
SILENCED_SYSTEM_CHECKS = ["security.W021"]
