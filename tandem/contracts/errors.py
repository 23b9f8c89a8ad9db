"""Codes of the platform API's errors, ``{"error": {"code", "message", "fields"}}``.

A process recognises another's answer by its code, which is stable; the message
is for people and may change.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """The code of each kind of error the platform's own services raise (``domain_errors``)."""

    INVALID = "invalid"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    PERMISSION_DENIED = "permission_denied"


# The header that names the trainer (its ``hostname:pid``, as it claimed) on each of its
# writes to a run: the platform takes them only from the trainer holding the run.
TRAINER_HEADER = "X-Tandem-Trainer"


class TrainerConflictCode(StrEnum):
    """The error codes of the 409s a trainer can get for a run; the trainer acts on the code, not the message."""

    # Another trainer holds the run: it was presumed dead and resumed elsewhere. Stop working on it.
    RUN_HELD_BY_ANOTHER_TRAINER = "run_held_by_another_trainer"
    # The run is queued: a trainer reports on a run only after claiming it.
    RUN_NOT_CLAIMED = "run_not_claimed"
