from django.conf import settings as django_settings
from django.db import models

from tandem.contracts import (
    ENVIRONMENT_KINDS,
    EnvironmentSpec,
    environment_kind_choices,
    episode_limit,
)


class Environment(models.Model):
    """A name in a project under which environment versions are registered."""

    project = models.ForeignKey(
        "accounts.Project", on_delete=models.CASCADE, related_name="environments"
    )
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"], name="environment_name_unique_per_project"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class EnvironmentVersion(models.Model):
    """One immutable registration of an environment: its kind, settings and tool schemas.

    The definition never changes after creation (a change is a new version);
    ``status`` and its reason follow the probe and the health checks, through
    ``environment_registry.services`` only. Runs pin the version they were created on.
    """

    # The contract's table of kinds (tandem.contracts.ENVIRONMENT_KINDS), as Django
    # choices for forms and filters: Kind.HTTP == "http".
    Kind = models.TextChoices(
        "Kind", [(kind.upper(), (kind, definition.label)) for kind, definition in ENVIRONMENT_KINDS.items()]
    )

    class Status(models.TextChoices):
        PENDING = "pending", "Probe pending"
        READY = "ready", "Ready"
        FAILED = "failed", "Probe failed"
        UNHEALTHY = "unhealthy", "Unhealthy"

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField(help_text="1, 2, ... within the environment.")
    kind = models.CharField(max_length=16, choices=environment_kind_choices)
    entrypoint = models.CharField(
        max_length=255, help_text="`module:Class` producers load; the adapter's for non-python kinds."
    )
    settings = models.JSONField(
        default=dict, blank=True, help_text="Keyword arguments for the class."
    )
    tools = models.JSONField(
        default=list, blank=True, help_text="Declared tool schemas: [{name, description, parameters}]."
    )
    # The names only, which anyone who may read the version may see; the values are in
    # EnvironmentVersionSecrets, a table of their own that no list, page or serializer reads.
    secret_setting_names = models.JSONField(
        default=list, blank=True, help_text="Names of the write-only secret settings, sorted."
    )
    tool_server = models.JSONField(
        null=True, blank=True,
        help_text="The MCP server its episodes take tools from ({command: a name of TANDEM_MCP_SERVERS}); "
        "empty: none.",
    )
    max_concurrent_episodes = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Registered limit of episodes at once, across every producer; empty: no limit.",
    )
    created_by = models.ForeignKey(
        django_settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Not part of the definition: it follows the probes, like the status.
    advertised_max_concurrent_episodes = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="The concurrent episodes the environment said it can serve at its latest passed probe.",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    status_reason = models.TextField(blank=True, default="")
    status_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["environment_id", "-number"]
        constraints = [
            models.UniqueConstraint(
                fields=["environment", "number"], name="environment_version_number_unique"
            ),
        ]
        indexes = [models.Index(fields=["status"], name="environment_version_status_idx")]

    def __str__(self) -> str:
        return f"{self.environment.name}@{self.number}"

    @property
    def episode_limit(self) -> int | None:
        """The limit producers hold to: the registration's, or the advertised capacity when that is smaller."""
        return episode_limit(self.max_concurrent_episodes, self.advertised_max_concurrent_episodes)

    @property
    def is_dispatchable(self) -> bool:
        """Runs pinned to it may start and produce episodes."""
        return self.status == self.Status.READY

    def to_spec(self) -> EnvironmentSpec:
        """The version as the cross-process contract describes it to producers and probes."""
        return EnvironmentSpec(
            name=self.environment.name,
            version=self.number,
            version_id=self.pk,
            kind=self.kind,
            entrypoint=self.entrypoint,
            settings=self.settings,
            tools=self.tools,
            tool_server=self.tool_server,
            secret_setting_names=tuple(self.secret_setting_names),
            max_concurrent_episodes=self.episode_limit,
        )


class EnvironmentVersionSecrets(models.Model):
    """The values of a version's secret settings: write-only, read only to hand them to workers.

    Apart from EnvironmentVersion so that nothing that shows a version (the API, pages,
    the admin, a ``dumpdata`` of versions) ever loads them; only
    ``selectors.environment_version_secret_settings`` does, for producers and probes. And
    encrypted (secret_values.py), so that a database dump or backup holds no value either.
    """

    version = models.OneToOneField(
        EnvironmentVersion, on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    ciphertext = models.TextField(
        help_text="A Fernet token of the JSON setting name -> value, under TANDEM_SECRETS_KEY's first key "
        "when it was written (environment_registry.secret_values)."
    )

    def __str__(self) -> str:
        return f"secret settings of version {self.version_id}"  # never the values


class EnvironmentProbe(models.Model):
    """One run of the conformance probe against a version: at registration, on request, or as a health check."""

    class Purpose(models.TextChoices):
        REGISTRATION = "registration", "Registration"
        MANUAL = "manual", "Requested"
        HEALTH = "health", "Health check"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        PASSED = "passed", "Passed"
        FAILED = "failed", "Failed"

    version = models.ForeignKey(EnvironmentVersion, on_delete=models.CASCADE, related_name="probes")
    purpose = models.CharField(max_length=16, choices=Purpose.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    checks = models.JSONField(
        default=list, blank=True,
        help_text="[{name, status, message, latency_s, timeout_s}] from tandem.contracts.ProbeCheck.",
    )
    worker = models.CharField(max_length=255, blank=True, default="")
    baseline_request = models.JSONField(
        null=True, blank=True,
        help_text="The imported model's baseline the probe was asked to run (tandem.contracts.ProbeBaselineRequest); "
        "null: none.",
    )
    baseline = models.JSONField(
        null=True, blank=True,
        help_text="What the baseline's episodes showed (tandem.contracts.ProbeBaseline): tool-call rate and the rest.",
    )
    requested_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [
            models.Index(fields=["version", "-requested_at"], name="probe_version_requested_idx"),
            models.Index(fields=["status", "requested_at"], name="probe_status_requested_idx"),
        ]

    def __str__(self) -> str:
        return f"probe {self.pk} of {self.version_id} ({self.status})"

    @property
    def failure_message(self) -> str:
        """The failed checks, as one line for a status reason."""
        return "; ".join(
            f"{check['name']}: {check['message']}"
            for check in self.checks
            if check.get("status") == "failed"
        )
