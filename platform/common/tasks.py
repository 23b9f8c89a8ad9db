"""The platform's side of the task table (tandem.contracts.tasks): its tasks and its sends, by route.

Both go through the platform's own Celery app, which ``config.celery`` hands to :func:`use_platform_app`
when Django starts, never through Celery's *current* app: any ``Celery(...)`` created later in the
process (a library's, a test's, the trainer's entry point run in-process) becomes the current one,
and the platform's tasks would go out on its broker, with its routes, or nowhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery

    from tandem.contracts import TaskRoute

_platform_app: Celery | None = None


def use_platform_app(app: Celery) -> None:
    """Make ``app`` the one the platform's tasks are defined on and sent through (``config.celery`` calls it)."""
    global _platform_app  # noqa: PLW0603 - one app per process, set once at start-up
    _platform_app = app


def _app() -> Celery:
    if _platform_app is None:
        raise RuntimeError("the platform's Celery app is not set: config.celery sets it when Django starts "
                           "(DJANGO_SETTINGS_MODULE=config.settings.*)")
    return _platform_app


def platform_task(route: TaskRoute, **options: Any) -> Callable:
    """A task of the platform's app named as ``route`` says; ``options`` are Celery's (time limits, retries).

    Its queue is the route's through the platform app's ``task_routes`` (CELERY_TASK_ROUTES, from the table).
    """
    return _app().task(name=route.name, **options)


def send_task(route: TaskRoute, *args: Any) -> None:
    """Send the task of ``route`` with ``args`` to its queue, by name (the code that runs it may live elsewhere)."""
    _app().send_task(route.name, args=list(args), queue=route.queue)
