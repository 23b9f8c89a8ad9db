"""Alerts: where their webhooks may post, how hard a delivery is retried, and what one project can
make the platform post (platform/alerts)."""

from .env_vars import env_float, env_list, env_str

# Hosts and networks alert webhooks may post to (comma separated: host names, *.domain suffixes,
# networks such as 10.0.0.0/8 or 127.0.0.1; tandem/allowlists/environment_urls.py). A webhook URL is user
# input that makes the platform connect somewhere, so nothing is allowed until the operator lists it.
TANDEM_WEBHOOK_ALLOWED_HOSTS = env_list("TANDEM_WEBHOOK_ALLOWED_HOSTS", [])
# Attempts per delivery before it is recorded as failed; each is recorded with its answer.
TANDEM_WEBHOOK_MAX_ATTEMPTS = int(env_float("TANDEM_WEBHOOK_MAX_ATTEMPTS", 5))
# The wait before the second attempt; it doubles for each later one (10 s, 20 s, 40 s, 80 s).
TANDEM_WEBHOOK_BACKOFF_S = env_float("TANDEM_WEBHOOK_BACKOFF_S", 10.0)
# One post's whole deadline: connect, send and every read together (a receiver that trickles its
# answer is cut off here); a post without a complete answer by then is a failed attempt.
TANDEM_WEBHOOK_TIMEOUT_S = env_float("TANDEM_WEBHOOK_TIMEOUT_S", 10.0)
# The delivery task's Celery time limits (soft: the post is abandoned and recorded as a failed
# attempt; hard: the prefork child is killed), the backstop for what the deadline does not bound
# (a hanging DNS lookup). Enforced by the webhooks worker's prefork pool, never by a solo pool.
TANDEM_WEBHOOK_TASK_SOFT_TIME_LIMIT_S = env_float("TANDEM_WEBHOOK_TASK_SOFT_TIME_LIMIT_S", 50.0)
TANDEM_WEBHOOK_TASK_TIME_LIMIT_S = env_float("TANDEM_WEBHOOK_TASK_TIME_LIMIT_S", 60.0)
# Posts to one webhook URL per minute, across all rules and projects; a delivery past it is
# recorded as rate_limited (with its reason) instead of posted: one failing run must not flood a channel.
TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE = int(env_float("TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE", 10))
# Alert rules one project may have: each is a post per firing, so this bounds what one event posts.
TANDEM_MAX_ALERT_RULES_PER_PROJECT = int(env_float("TANDEM_MAX_ALERT_RULES_PER_PROJECT", 20))
# The dashboard's address as people reach it (https://tandem.example.com): a webhook post links to the run it
# is about there. Empty: the link is the run page's path (/runs/7/), for a reader who knows the host.
TANDEM_PUBLIC_URL = env_str("TANDEM_PUBLIC_URL", "").rstrip("/")
