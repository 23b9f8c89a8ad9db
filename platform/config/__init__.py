"""Project wiring of the Tandem platform: settings, URLs, ASGI and Celery apps."""

# Importing the Celery app here sets it as the platform's (common.tasks) whenever Django starts.
from .celery import app as celery_app

__all__ = ("celery_app",)
