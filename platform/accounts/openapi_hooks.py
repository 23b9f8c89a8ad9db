"""The API schema as each caller may see it: the trainer's routes only in a trainer's schema."""

from __future__ import annotations

from accounts.selectors import user_is_trainer

TRAINER_PATH_PREFIX = "/api/trainer/"


def hide_trainer_operations(result, generator, request, public):
    """drf-spectacular postprocessing hook: the trainer's routes only in a trainer's schema."""
    if request is None or user_is_trainer(user=request.user):
        return result
    result["paths"] = {
        path: operations for path, operations in result["paths"].items()
        if not path.startswith(TRAINER_PATH_PREFIX)
    }
    return result
