from django.db import models
from django.utils import timezone


class MetricPoint(models.Model):
    """One value of one series (``loss``, ``reward_mean`` ...) at one trainer step."""

    # Not indexed on its own: both composite indexes below start with the run.
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="metric_points", db_index=False
    )
    step = models.IntegerField()
    name = models.CharField(max_length=64)
    value = models.FloatField()
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Makes a retried telemetry post idempotent, and is the (run, name, step)
            # index that per-series reads use.
            models.UniqueConstraint(fields=["run", "name", "step"], name="metric_point_unique"),
        ]
        indexes = [
            # The REST backfill reads every series of a run by step.
            models.Index(fields=["run", "step"], name="metric_point_run_step_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.step}={self.value}"
