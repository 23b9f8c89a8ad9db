"""Alerts' Celery tasks, on the webhooks queue and its prefork worker; thin: they call a service.

The webhooks worker (``tandem platform-worker --queues platform-webhooks --pool prefork``) is a
worker of its own so that a receiver's slowness never delays probe reports, the reaper or the log
drains (the platform queue), and prefork because it enforces the time limits (a solo pool does not).
"""

from django.conf import settings

from common.tasks import platform_task
from tandem.contracts import WEBHOOK_DELIVERY, WEBHOOK_RESUME

from .services import webhook_deliveries_resume, webhook_delivery_attempt


# max_retries=None: the service decides when to give up (TANDEM_WEBHOOK_MAX_ATTEMPTS) and records
# every attempt; the limits cover one post (its deadline, TANDEM_WEBHOOK_TIMEOUT_S) with room to spare.
@platform_task(WEBHOOK_DELIVERY, bind=True, max_retries=None,
               soft_time_limit=settings.TANDEM_WEBHOOK_TASK_SOFT_TIME_LIMIT_S,
               time_limit=settings.TANDEM_WEBHOOK_TASK_TIME_LIMIT_S)
def deliver_webhook(self, delivery_id: int) -> None:
    """Post an alert's webhook delivery; on failure, try again after the service's backoff."""
    retry_in_s = webhook_delivery_attempt(delivery_id=delivery_id)
    if retry_in_s is not None:
        raise self.retry(countdown=retry_in_s, queue=WEBHOOK_DELIVERY.queue)


@platform_task(WEBHOOK_RESUME, soft_time_limit=30, time_limit=40)
def resume_abandoned_webhook_deliveries() -> int:
    """Celery beat's sweep: deliveries whose worker was killed mid-post are sent again."""
    return webhook_deliveries_resume()
