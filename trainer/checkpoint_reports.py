"""Telling the platform which of a run's checkpoints are on disk, without ever stopping training for it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tandem.contracts import CheckpointInfo, CheckpointReport
from trainer.platform_client import PlatformClient

logger = logging.getLogger(__name__)

# A platform that fails a checkpoint report is asked again no sooner than this.
CHECKPOINT_REPORT_RETRY_S = 10.0


class CheckpointReporter:
    """Posts a run's committed checkpoints each time a newer one commits.

    ``committed_checkpoints()`` lists what is on disk (the run's checkpointer). A failed post is
    logged and tried again, no sooner than ``retry_s`` later, at the next call: the platform being
    away never stops training, and the next commit's report carries every checkpoint anyway.
    """

    def __init__(self, platform: PlatformClient, run_id: int, *,
                 committed_checkpoints: Callable[[], list[CheckpointInfo]],
                 retry_s: float = CHECKPOINT_REPORT_RETRY_S):
        self._platform = platform
        self._run_id = run_id
        self._committed_checkpoints = committed_checkpoints
        self._retry_s = retry_s
        self.reported_step: int | None = None
        self._retry_at = 0.0

    def committed(self, step: int | None) -> None:
        """``step`` is the newest committed checkpoint's (None: none yet); reports it unless done already."""
        if step is None or step == self.reported_step or time.monotonic() < self._retry_at:
            return
        try:
            self._platform.report_checkpoints(
                self._run_id, CheckpointReport(checkpoints=self._committed_checkpoints()))
        except Exception:
            logger.exception("run %s: reporting checkpoints failed; retrying in %ss", self._run_id, self._retry_s)
            self._retry_at = time.monotonic() + self._retry_s
            return
        self.reported_step = step
