"""The platform's Celery app, configured from Django settings (``CELERY_*``)."""

import os

from celery import Celery
from celery.signals import beat_embedded_init, worker_ready, worker_shutdown

from common.tasks import use_platform_app

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

app = Celery("tandem_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Before any app's tasks module is imported: their tasks are defined on this app, and sent through it.
use_platform_app(app)
app.autodiscover_tasks()


# The platform worker reports its CPU and memory for the devices page. Signals are
# process-wide, so each handler checks that the worker is this app's. The imports
# wait for the handlers: config.asgi puts the repository root on sys.path only
# after this package is imported.
def _start_process_reporter(name: str) -> None:
    from django.conf import settings

    from tandem.runtime.process_reports import start_process_reporter

    start_process_reporter(redis_url=settings.REDIS_URL, role="platform_worker", name=name)


@worker_ready.connect
def _start_process_report(sender, **_):
    if sender.app is app:
        _start_process_reporter(sender.hostname)


@worker_shutdown.connect
def _stop_process_report(sender, **_):
    if sender.app is app:
        from tandem.runtime.process_reports import stop_process_reporter

        stop_process_reporter()


# `--beat` runs Celery beat in a child process of its own: it reports too. It is
# stopped with the worker and never says so, so its report is pruned once stale.
@beat_embedded_init.connect
def _start_beat_process_report(sender, **_):
    if sender.app is app:
        _start_process_reporter("celery beat")
