"""The platform's side of the task table (tandem.contracts.tasks): its tasks and its sends, by route."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import current_app, shared_task

from tandem.contracts import TaskRoute


def platform_task(route: TaskRoute, **options: Any) -> Callable:
    """``@shared_task`` named as ``route`` says; ``options`` are Celery's (time limits, retries).

    Its queue is the route's through the platform app's ``task_routes`` (CELERY_TASK_ROUTES, from the table).
    """
    return shared_task(name=route.name, **options)


def send_task(route: TaskRoute, *args: Any) -> None:
    """Send the task of ``route`` with ``args`` to its queue, by name (the code that runs it may live elsewhere)."""
    current_app.send_task(route.name, args=list(args), queue=route.queue)
