"""Sweeps: runs of one base config over a search space, sampled and pruned by an Optuna study that lives in
the platform's database (sweeps.studies), each trial one run."""

from django.conf import settings
from django.db import models


class Sweep(models.Model):
    class Sampler(models.TextChoices):
        GRID = "grid", "grid"
        RANDOM = "random", "random"
        TPE = "tpe", "TPE"

    class Pruner(models.TextChoices):
        NONE = "none", "none"
        MEDIAN = "median", "median"
        SUCCESSIVE_HALVING = "successive_halving", "successive halving"

    class Goal(models.TextChoices):
        MAXIMIZE = "maximize", "maximize"
        MINIMIZE = "minimize", "minimize"

    class Status(models.TextChoices):
        RUNNING = "running", "running"
        FINISHED = "finished", "finished"
        CANCELLED = "cancelled", "cancelled"

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="sweeps")
    name = models.CharField(max_length=200)
    # What each trial's run is created with (runs.services.run_create's environment_name and config).
    environment = models.CharField(max_length=300)
    base_config = models.JSONField()
    # {config path: distribution} (sweeps.services.SearchSpace), e.g. {"learning_rate": {"type": "float",
    # "low": 1e-5, "high": 1e-3, "log": true}}.
    search_space = models.JSONField()
    sampler = models.CharField(max_length=16, choices=Sampler.choices)
    pruner = models.CharField(max_length=24, choices=Pruner.choices, default=Pruner.NONE)
    # The series a trial is judged by (as charted: reward_mean, eval/success_rate ...): its value at the
    # run's last step, and at each step for the pruner.
    metric = models.CharField(max_length=200)
    goal = models.CharField(max_length=8, choices=Goal.choices)
    max_runs = models.PositiveIntegerField()
    concurrency = models.PositiveIntegerField()
    seed = models.IntegerField(default=0)
    # The Optuna study's name in its storage (sweeps.studies).
    study_name = models.CharField(max_length=100, unique=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    status_reason = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} (sweep {self.pk})"


class SweepTrial(models.Model):
    """One trial of a sweep's study: the parameters it drew and the run that tried them."""

    class State(models.TextChoices):
        RUNNING = "running", "running"
        COMPLETE = "complete", "complete"
        PRUNED = "pruned", "pruned"
        FAILED = "failed", "failed"

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="trials")
    number = models.PositiveIntegerField(help_text="The Optuna trial's number in its study.")
    optuna_trial_id = models.PositiveIntegerField()
    run = models.ForeignKey("runs.Run", on_delete=models.SET_NULL, null=True, related_name="+")
    params = models.JSONField(help_text="{config path: value} the trial drew.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    value = models.FloatField(null=True, help_text="The metric at the run's last step (complete trials).")
    # The newest step whose metric was reported to the study (for the pruner); each step is reported once.
    reported_step = models.IntegerField(null=True)
    reason = models.TextField(blank=True, default="", help_text="Why it was pruned or failed.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["sweep_id", "number"]
        constraints = [models.UniqueConstraint(fields=["sweep", "number"], name="sweep_trial_number_unique")]
