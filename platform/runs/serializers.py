from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from alerts.selectors import run_alerts_active
from common.db_limits import require_no_nul
from environment_registry.serializers import EnvironmentVersionStatusSerializer

from .models import Run, RunAttempt
from .realtime import run_websocket_path
from .selectors import run_evaluation_environments, run_memory_plan, trainer_device_memory


class RunAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunAttempt
        fields = ["number", "trainer", "started_at", "ended_at", "outcome", "reason", "trainer_step"]


class RunSerializer(serializers.ModelSerializer):
    environment = serializers.CharField(source="environment.name")
    attempt_history = RunAttemptSerializer(
        many=True, read_only=True,
        help_text="Each trainer's hold on the run, first claim first: when it ended and why (a restart, a pause...).",
    )
    environment_version = EnvironmentVersionStatusSerializer(
        read_only=True, help_text="The pinned version; not dispatchable: the run waits, with the reason."
    )
    urls = serializers.SerializerMethodField()
    memory_plan = serializers.SerializerMethodField(
        help_text="Expected peak memory in bytes, by part, of the run's trainer (parameters, reference, gradients, "
        "optimizer, one micro-batch's activations and logits) and of one producer engine (weights, KV cache, "
        "logits), from its config. A run whose trainer needs more than TANDEM_TRAINER_MEMORY_BYTES (by default, "
        "the device memory live trainers report) is refused.")

    class Meta:
        model = Run
        fields = [
            "id",
            "project",
            "name",
            "environment",
            "environment_version",
            "status",
            "status_reason",
            "config",
            "policy_version",
            "trainer_step",
            "attempts",
            "attempt_history",
            "restarts",
            "claimable_after",
            "stalled_since",
            "heartbeat_at",
            "created_at",
            "started_at",
            "finished_at",
            "tags",
            "notes",
            "memory_plan",
            "urls",
        ]
        read_only_fields = ["claimable_after"]  # the trainer's to ask for (its heartbeat's retry_after_s)

    def get_memory_plan(self, run: Run) -> dict[str, dict[str, int]]:
        # One read of the trainers' reports per response, however many runs it lists.
        if "trainer_device" not in self.context:
            self.context["trainer_device"] = trainer_device_memory()
        return run_memory_plan(run, trainer_device=self.context["trainer_device"])

    def get_urls(self, run: Run) -> dict:
        page = reverse("run-page", args=[run.pk])
        websocket = run_websocket_path(run.pk)
        request = self.context.get("request")
        if request is None:
            return {"page": page, "websocket": websocket}
        scheme = "wss" if request.is_secure() else "ws"
        return {
            "page": request.build_absolute_uri(page),
            "websocket": f"{scheme}://{request.get_host()}{websocket}",
        }


class RunAlertSerializer(serializers.Serializer):
    rule = serializers.IntegerField(help_text="The alert rule's id.")
    name = serializers.CharField()
    kind = serializers.CharField()
    active = serializers.BooleanField()
    text = serializers.CharField(help_text="What its newest firing on the run said.")
    fired_at = serializers.DateTimeField(allow_null=True)


class RunDetailSerializer(RunSerializer):
    """One run, as every endpoint about a single run answers: with the alerts whose condition holds on it
    now (a tools_unused rule's, say). The list leaves them out (a query per run)."""

    alerts = serializers.SerializerMethodField(help_text="The project's alert rules whose condition holds on this "
                                               "run now, each with what its newest firing said.")

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "alerts"]

    @extend_schema_field(RunAlertSerializer(many=True))
    def get_alerts(self, run: Run) -> list[dict]:
        return run_alerts_active(run_id=run.pk)


class RunAnnotationSerializer(serializers.Serializer):
    """A PATCH of a run: its tags and notes, either or both (runs.services.run_annotate checks them)."""

    tags = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False,
        help_text="Replaces the run's tags: short labels, repeats and blanks dropped.",
    )
    notes = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)

    def validate(self, attrs: dict) -> dict:
        require_no_nul(attrs, "run")  # PostgreSQL text and jsonb cannot hold one
        return attrs


class RunCreateSerializer(serializers.Serializer):
    project = serializers.IntegerField(
        required=False, allow_null=True, help_text="Defaults to the caller's only project."
    )
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    environment = serializers.CharField(
        max_length=100, help_text="Name of an environment of the project."
    )
    config = serializers.DictField(
        required=False, default=dict,
        help_text="A partial RunConfig; defaults fill the rest. Without schema_version it is read as "
        "version 1 (the flat shape) and upgraded.",
    )

    def validate_config(self, config: dict) -> dict:
        require_no_nul(config, "config")  # jsonb cannot hold one
        return config


class RunCloneSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    config = serializers.DictField(
        required=False, default=dict,
        help_text="Only what differs from the original run's config; merged key by key. Without "
        "schema_version it is read as version 1 (the flat shape) and upgraded.",
    )


class TrainerClaimSerializer(serializers.Serializer):
    worker = serializers.CharField(max_length=255, help_text="`hostname:pid` of the trainer.")


class ClaimedRunSerializer(serializers.ModelSerializer):
    """A claimed run as the trainer needs it: config and the environment's contract spec."""

    environment = serializers.SerializerMethodField()
    evaluation_environments = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id",
            "project",
            "name",
            "config",
            "environment",
            "evaluation_environments",
            "policy_version",
            "trainer_step",
            "attempts",
        ]

    def get_environment(self, run: Run) -> dict:
        return run.environment_version.to_spec().model_dump(mode="json")

    def get_evaluation_environments(self, run: Run) -> list[dict]:
        """The contract specs of the other environments its evaluations run on (config.evaluation.environments)."""
        return [version.to_spec().model_dump(mode="json") for version in run_evaluation_environments(run)]
