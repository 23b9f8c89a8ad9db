"""A run's log lines, drained from its Redis stream (tandem.contracts.RunLogRecord), and how far it was drained."""

from django.db import models


class RunLogLine(models.Model):
    """One record a trainer or producer logged for the run; its id is the API's cursor."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="log_lines")
    logged_at = models.DateTimeField(help_text="When the process logged it, by that process's clock.")
    # Python's logging numbers (10 DEBUG ... 50 CRITICAL): "this level and above" is one comparison.
    level = models.PositiveSmallIntegerField()
    role = models.CharField(max_length=32, help_text="The process's role: trainer or rollout_worker.")
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    logger = models.CharField(max_length=255)
    message = models.TextField()
    traceback = models.TextField(blank=True, default="")

    class Meta:
        indexes = [
            # Every read is one run's lines by id: the tail, a cursor, a level.
            models.Index(fields=["run", "id"], name="run_log_line_run_id_idx"),
            models.Index(fields=["run", "level", "id"], name="run_log_line_run_level_idx"),
        ]


class RunLogState(models.Model):
    """Where the platform is in the run's log stream, and what it stored and deleted."""

    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, primary_key=True, related_name="log_state")
    stream_cursor = models.CharField(
        max_length=40, default="0-0", help_text="The id of the last stream entry stored; the next drain reads after it."
    )
    lines_kept = models.PositiveIntegerField(default=0)
    lines_deleted = models.PositiveBigIntegerField(
        default=0, help_text="Oldest lines deleted to keep the run under TANDEM_RUN_LOG_LINES_MAX."
    )
    lines_lost = models.PositiveBigIntegerField(
        default=0, help_text="Entries Redis trimmed from the bounded stream before the platform read them."
    )
    # The stream's own counters as of the last drain (XINFO STREAM), to tell trimmed entries
    # from read ones: entries added = deleted by the platform + trimmed by Redis + still there.
    # A stream that expired and came back counts from zero again.
    stream_entries_added = models.PositiveBigIntegerField(default=0)
    stream_entries_deleted = models.PositiveBigIntegerField(default=0, help_text="By the platform, once stored.")
    stream_entries_trimmed = models.PositiveBigIntegerField(default=0, help_text="By Redis, unread (counted lost).")
