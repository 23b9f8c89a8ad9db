from django.db import models

from tandem.contracts import evaluation_kind_choices, evaluation_status_choices


class Evaluation(models.Model):
    """One held-out evaluation of a run's policy version, as its trainer reported it
    (tandem.contracts.EvaluationReport)."""

    # Not indexed on its own: the unique (run, index) constraint below starts with the run.
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="evaluations", db_index=False)
    index = models.PositiveIntegerField(help_text="The evaluation's index in its run (0, 1, ...).")
    step = models.PositiveIntegerField(help_text="Trainer steps done when the version was published.")
    policy_version = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=evaluation_kind_choices, default="environment",
                            help_text="What it is of: an environment version's held-out tasks or a dataset "
                            "version's held-out rows.")
    environment = models.CharField(max_length=200, help_text="The environment or dataset version's label, "
                                   "name@version.")
    status = models.CharField(max_length=16, choices=evaluation_status_choices)
    reason = models.TextField(blank=True, default="", help_text="Why it is incomplete; empty when complete.")
    tasks = models.PositiveIntegerField()
    samples_per_task = models.PositiveIntegerField()
    temperature = models.FloatField()
    episodes = models.PositiveIntegerField(help_text="Episodes the metrics are of.")
    # {name: value}: EVALUATION_METRICS, pass@k and avg@k.
    metrics = models.JSONField()
    # {name: [low, high]}: 95% intervals of the metrics that have one.
    intervals = models.JSONField(default=dict)
    # Ids of its episodes, none of which is ever trained on; up to 100,000 of them.
    trajectory_ids = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # A retried post updates its evaluation (one per environment or dataset at each point);
            # also the index the run's list reads in order.
            models.UniqueConstraint(fields=["run", "index", "kind", "environment"],
                                    name="evaluation_unique_run_index_target"),
        ]

    @property
    def target_label(self) -> str:
        """What it evaluated on, as tables show it: ``calculator@2``, or ``dataset support@1``."""
        return f"dataset {self.environment}" if self.kind == "dataset" else self.environment

    def __str__(self) -> str:
        return f"evaluation {self.index} of run {self.run_id} (step {self.step})"
