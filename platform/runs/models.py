from django.db import models
from django.utils import timezone

from tandem.contracts import (
    TERMINAL_RUN_STATUSES,
    RunStatus,
    run_status_choices,
)

from .fields import RunConfigField


class Run(models.Model):
    """One training run of a policy against an environment.

    ``status`` changes only through ``runs.services.run_transition``.
    """

    # The contract's vocabulary (tandem.contracts.RunStatus), as Django choices for
    # forms, filters and the admin: Run.Status.RUNNING == RunStatus.RUNNING == "running".
    Status = models.TextChoices("Status", [(status.name, (status.value, status.label)) for status in RunStatus])

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="runs")
    environment = models.ForeignKey(
        "environments.Environment", on_delete=models.PROTECT, related_name="runs"
    )
    environment_version = models.ForeignKey(
        "environments.EnvironmentVersion",
        on_delete=models.PROTECT,
        related_name="runs",
        help_text="The version the run pinned when it was created; producers load exactly it.",
    )
    name = models.CharField(max_length=200)
    # Read in the current shape whatever shape it was stored in (fields.RunConfigField).
    config = RunConfigField(help_text="The validated RunConfig with every default filled in.")
    status = models.CharField(max_length=16, choices=run_status_choices, default=RunStatus.QUEUED.value)
    status_reason = models.TextField(blank=True, default="")
    policy_version = models.PositiveIntegerField(default=0)
    trainer_step = models.PositiveIntegerField(default=0)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(
        max_length=255, blank=True, default="", help_text="`hostname:pid` of the trainer."
    )
    attempts = models.PositiveIntegerField(
        default=0,
        help_text="Times a trainer claimed the run; past the first, the trainer resumes from its checkpoint.",
    )
    restarts = models.PositiveIntegerField(
        default=0, help_text="Times the platform queued the run again after its trainer died, lost a process or set "
        "it aside (config.max_restarts)."
    )
    claimable_after = models.DateTimeField(
        null=True, blank=True,
        help_text="A queued run no trainer claims before then: its trainer set it aside (the platform kept "
        "failing a read of its data) and asked to be given other runs meanwhile; cleared by the next claim.",
    )
    progress_at = models.DateTimeField(
        null=True, blank=True, help_text="When the trainer step last advanced (or the run started running)."
    )
    progress_step = models.PositiveIntegerField(
        default=0, help_text="The step the current attempt last reported: a resumed trainer trains steps again "
        "from its checkpoint, below trainer_step, and that is progress too.",
    )
    stalled_since = models.DateTimeField(
        null=True, blank=True,
        help_text="Set by the progress watchdog: the run runs but its step has not advanced for "
        "config.stall_timeout_s since then; cleared when it advances.",
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # People's own labels, edited on the run list (runs.services.run_annotate); nothing reads them.
    tags = models.JSONField(default=list, blank=True, help_text="Short labels, unique, in the order given.")
    notes = models.TextField(blank=True, default="", help_text="Free text about the run.")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The trainer's claim: the oldest queued run.
            models.Index(fields=["status", "created_at"], name="run_status_created_idx"),
            models.Index(fields=["project", "-created_at"], name="run_project_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES


class RunAttempt(models.Model):
    """One trainer's hold on a run, from its claim to the moment it let go (or was presumed dead)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempt_history")
    number = models.PositiveIntegerField(help_text="1 for the first claim; Run.attempts counts them.")
    trainer = models.CharField(max_length=255, help_text="`hostname:pid` of the trainer that claimed it.")
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    # The run's status when the attempt ended: queued again (a restart), paused, failed, finished...
    outcome = models.CharField(max_length=16, blank=True, default="", choices=run_status_choices)
    reason = models.TextField(blank=True, default="")
    trainer_step = models.PositiveIntegerField(default=0, help_text="The run's step when the attempt ended.")

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="run_attempt_unique")]

    def __str__(self) -> str:
        return f"run {self.run_id} attempt {self.number} ({self.outcome or 'ongoing'})"
