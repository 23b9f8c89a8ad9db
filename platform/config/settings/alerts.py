"""Alerts: where their webhooks may post, and how hard a delivery is retried (platform/alerts)."""

from .env_vars import env_float, env_list

# Hosts and networks alert webhooks may post to (comma separated: host names, *.domain suffixes,
# networks such as 10.0.0.0/8 or 127.0.0.1; tandem/environment_urls.py). A webhook URL is user
# input that makes the platform connect somewhere, so nothing is allowed until the operator lists it.
TANDEM_WEBHOOK_ALLOWED_HOSTS = env_list("TANDEM_WEBHOOK_ALLOWED_HOSTS", [])
# Attempts per delivery before it is recorded as failed; each is recorded with its answer.
TANDEM_WEBHOOK_MAX_ATTEMPTS = int(env_float("TANDEM_WEBHOOK_MAX_ATTEMPTS", 5))
# The wait before the second attempt; it doubles for each later one (10 s, 20 s, 40 s, 80 s).
TANDEM_WEBHOOK_BACKOFF_S = env_float("TANDEM_WEBHOOK_BACKOFF_S", 10.0)
# A receiver that has not answered within this many seconds counts as a failed attempt.
TANDEM_WEBHOOK_TIMEOUT_S = env_float("TANDEM_WEBHOOK_TIMEOUT_S", 10.0)
