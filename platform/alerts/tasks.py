"""Platform worker tasks of alerts; thin: they call a service."""

from celery import shared_task

from tandem.contracts import PLATFORM_QUEUE

from .services import WEBHOOK_TASK_NAME, webhook_delivery_attempt


# max_retries=None: the service decides when to give up (TANDEM_WEBHOOK_MAX_ATTEMPTS) and records
# every attempt; the limits cover one post (TANDEM_WEBHOOK_TIMEOUT_S) with room to spare.
@shared_task(bind=True, name=WEBHOOK_TASK_NAME, queue=PLATFORM_QUEUE, max_retries=None,
             soft_time_limit=50, time_limit=60)
def deliver_webhook(self, delivery_id: int) -> None:
    """Post an alert's webhook delivery; on failure, try again after the service's backoff."""
    retry_in_s = webhook_delivery_attempt(delivery_id=delivery_id)
    if retry_in_s is not None:
        raise self.retry(countdown=retry_in_s)
