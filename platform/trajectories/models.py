from django.db import models
from django.utils import timezone

from tandem.contracts import episode_status_choices, sample_purpose_choices

#: The contract's vocabulary (tandem.contracts.SamplePurpose), as the API schema names it.
SAMPLE_PURPOSE_CHOICES = sample_purpose_choices()


class TrajectorySample(models.Model):
    """A trajectory the trainer trained on and sent for people to read (tandem.contracts.TrajectorySample).

    The columns are what lists filter and show; ``payload`` is the whole record,
    turns included, read only by the detail view.
    """

    # The contract's vocabulary (tandem.contracts.EpisodeStatus): ok, truncated, failed.
    Status = models.TextChoices("Status", [(value.upper(), (value, label)) for value, label in episode_status_choices()])

    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="trajectory_samples", db_index=False
    )
    trajectory_id = models.CharField(max_length=64)
    step = models.IntegerField(help_text="The trainer step whose update used it.")
    selected_because = models.CharField(max_length=16, help_text="best, worst, failed, or group (a whole group).")
    purpose = models.CharField(max_length=16, choices=sample_purpose_choices, default="training",
                               help_text="training: a step trained on it; evaluation: a held-out evaluation's.")
    environment = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=episode_status_choices)
    failure_reason = models.TextField(blank=True, default="")
    reward = models.FloatField()
    policy_version = models.IntegerField()
    num_turns = models.IntegerField()
    num_tokens = models.IntegerField()
    trained_tokens = models.IntegerField()
    group_id = models.CharField(max_length=128, blank=True, default="",
                                help_text="The GRPO group it was sampled with; the group view reads it.")
    group_size = models.IntegerField(null=True, help_text="Episodes of its group (None: a schema 1 sample).")
    advantage = models.FloatField(null=True, help_text="Its per-episode advantage in the update that trained it.")
    search_text = models.TextField(
        blank=True, default="",
        help_text="Its turns' text, one turn a line: what the browser's search matches (icontains). On "
        "PostgreSQL a trigram index on UPPER(search_text) serves it (migration 0004).",
    )
    tool_calls_run = models.IntegerField(default=0, help_text="Calls of its tools that parsed and ran.")
    tool_calls_unparsed = models.IntegerField(
        default=0, help_text="Its policy turns whose tool-call markup did not parse.")
    tool_calls_failed = models.IntegerField(
        default=0, help_text="Its policy turns whose tool-call markup made no call that ran: it did not parse, "
        "named an unknown tool, failed the tool's schema, or the tool refused it.")
    payload = models.JSONField(help_text="The TrajectorySample record as the trainer posted it.")
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # A retried post stores nothing twice; also the (run, ...) index of the detail read.
            models.UniqueConstraint(fields=["run", "trajectory_id"], name="trajectory_sample_unique"),
        ]
        indexes = [
            # Lists read a run's samples newest step first.
            models.Index(fields=["run", "-step", "-id"], name="trajectory_sample_run_step_idx"),
            # The group view reads one group's samples of a run.
            models.Index(fields=["run", "group_id"], name="trajectory_sample_group_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.trajectory_id} of run {self.run_id} (step {self.step})"
