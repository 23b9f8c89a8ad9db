"""The API's shapes of sweeps and their trials."""

from rest_framework import serializers

from .models import Sweep, SweepTrial
from .search_space import MAX_DIMENSIONS
from .services import MAX_SWEEP_RUNS


class SweepTrialSerializer(serializers.ModelSerializer):
    run_status = serializers.CharField(source="run.status", allow_null=True, default=None)

    class Meta:
        model = SweepTrial
        fields = ["number", "run", "run_status", "params", "state", "value", "reported_step", "reason"]


class SweepSerializer(serializers.ModelSerializer):
    trials = serializers.SerializerMethodField(help_text="Every trial, by number.")
    best = serializers.SerializerMethodField(help_text="The complete trial with the best value; null before one.")
    importances = serializers.SerializerMethodField(
        help_text="Optuna's importance of each parameter (fANOVA, summing to 1); empty before 2 complete trials.")
    importances_reason = serializers.SerializerMethodField(help_text="Why importances is empty, if it is.")

    class Meta:
        model = Sweep
        fields = ["id", "project", "name", "environment", "base_config", "search_space", "sampler", "pruner",
                  "metric", "goal", "max_runs", "concurrency", "seed", "status", "status_reason", "created_at",
                  "finished_at", "trials", "best", "importances", "importances_reason"]

    def _detail(self, sweep: Sweep) -> dict:
        return self.context["details"][sweep.pk]

    def get_trials(self, sweep: Sweep) -> list[dict]:
        return SweepTrialSerializer(self._detail(sweep)["trials"], many=True).data

    def get_best(self, sweep: Sweep) -> dict | None:
        best = self._detail(sweep)["best"]
        return SweepTrialSerializer(best).data if best is not None else None

    def get_importances(self, sweep: Sweep) -> dict[str, float]:
        return self._detail(sweep)["importances"][0]

    def get_importances_reason(self, sweep: Sweep) -> str:
        return self._detail(sweep)["importances"][1]


class SweepWriteSerializer(serializers.Serializer):
    project = serializers.IntegerField(required=False, help_text="Optional when you belong to one project only.")
    environment = serializers.CharField(max_length=300, help_text="The environment each trial runs, name[@version].")
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    base_config = serializers.JSONField(required=False, default=dict,
                                        help_text="The run config every trial starts from (a partial RunConfig).")
    search_space = serializers.JSONField(help_text=(
        f"Up to {MAX_DIMENSIONS} config paths, each a distribution: {{\"type\": \"float\"|\"int\", \"low\", "
        "\"high\", \"log\"?, \"step\"?}} or {\"type\": \"categorical\", \"choices\": [...]}."))
    sampler = serializers.ChoiceField(choices=Sweep.Sampler.choices, default=Sweep.Sampler.TPE)
    pruner = serializers.ChoiceField(choices=Sweep.Pruner.choices, default=Sweep.Pruner.NONE)
    metric = serializers.CharField(max_length=200, help_text="The series a trial is judged by, e.g. reward_mean.")
    goal = serializers.ChoiceField(choices=Sweep.Goal.choices, default=Sweep.Goal.MAXIMIZE)
    max_runs = serializers.IntegerField(min_value=1, max_value=MAX_SWEEP_RUNS)
    concurrency = serializers.IntegerField(min_value=1, default=1)
    seed = serializers.IntegerField(default=0)

    def validate(self, data):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
        return data
