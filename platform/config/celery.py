"""The platform's Celery app, configured from Django settings (``CELERY_*``)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

app = Celery("tandem_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
