from rest_framework import serializers

from common.db_limits import require_no_nul
from tandem.contracts import ENVIRONMENT_KINDS, EnvironmentSpec, ToolSchema

from .models import Environment, EnvironmentProbe, EnvironmentVersion


class ToolSchemaSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    parameters = serializers.DictField(help_text="JSON schema of the arguments, of type 'object'.")


class ProbeToolCallSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    arguments = serializers.DictField(required=False, default=dict)


class ToolServerSerializer(serializers.Serializer):
    """Exactly one of ``command`` and ``url``, and the calls the probe makes, if any."""

    command = serializers.CharField(
        max_length=64, required=False, help_text="A name of the operator's TANDEM_MCP_SERVERS: the MCP server "
        "(over stdio) each episode starts and stops.")
    url = serializers.CharField(
        max_length=2048, required=False, help_text="A streamable-HTTP MCP server's endpoint (http or https), "
        "under the address rules of HTTP environments (TANDEM_ENVIRONMENT_URL_ALLOWLIST); each episode "
        "connects on its own, and what the server keeps is its own (the protocol has no sessions over HTTP).")
    probe_calls = ProbeToolCallSerializer(
        many=True, required=False, max_length=8, help_text="Calls of the server's declared tools that the probe "
        "and health checks make, each to answer without an error. Omitted: they list the tools and call none.")

    def validate(self, attrs):
        if ("command" in attrs) == ("url" in attrs):
            field = "url" if "command" in attrs else "command"
            raise serializers.ValidationError({field: "Give exactly one of command (stdio) and url (streamable "
                                                      "HTTP)."})
        return attrs


BASELINE_HELP = (
    "The imported model whose baseline the probe plays once its checks pass: {\"model\": \"<directory "
    "under the operator's model roots>\", \"episodes\": 8, \"max_turns\": 4, \"max_new_tokens\": 128, "
    "\"max_seq_len\": 1024, \"temperature\": 0} (tandem.contracts.ProbeBaselineRequest). The probe reports "
    "its tool-call rate; one that never calls a tool is a warning. Omitted: the operator's default "
    "(TANDEM_PROBE_BASELINE_MODEL), if any."
)


class EnvironmentVersionRegisterSerializer(serializers.Serializer):
    """A version's definition: what producers load, with which settings and tools."""

    kind = serializers.ChoiceField(
        choices=EnvironmentVersion.Kind.choices, default=EnvironmentVersion.Kind.PYTHON
    )
    entrypoint = serializers.CharField(
        max_length=255, required=False, allow_blank=True, default="",
        help_text="`module:Class`, for kind 'python'; the other kinds load their adapter.",
    )
    settings = serializers.DictField(
        required=False, default=dict, help_text="Keyword arguments for the class or adapter."
    )
    tools = ToolSchemaSerializer(
        many=True, required=False, default=list,
        help_text="Tools the environment exposes, exactly; the probe checks them.",
    )
    tool_server = ToolServerSerializer(
        required=False, allow_null=True, default=None,
        help_text="An MCP server the episodes also take tools from; declare its tools in `tools` as the probe "
        "lists them (it calls none).",
    )
    max_concurrent_episodes = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=1_000_000,
        help_text="At most this many episodes of the version at once, across every producer; the others "
        "wait for a slot. Omitted or null: no limit, unless the server advertises one (the smaller wins).",
    )
    # Write-only: no response, page or error message ever holds a value, only the names
    # (`secret_setting_names`). trim_whitespace off: a key is taken exactly as it is sent.
    secret_settings = serializers.DictField(
        child=serializers.CharField(trim_whitespace=False), required=False, write_only=True,
        help_text="Keyword arguments like `settings` (API keys, tokens) that only producers and probes "
        "receive; never returned. A new version without them keeps the previous version's.",
    )

    baseline = serializers.DictField(
        required=False, allow_null=True, default=None,
        help_text=BASELINE_HELP,
    )

    def validate_settings(self, settings: dict) -> dict:
        require_no_nul(settings, "settings")  # jsonb cannot hold one
        return settings

    def validate(self, data):
        # A misspelt or renamed field would otherwise be dropped silently and the probe fail later.
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({
                key: ["Renamed 'settings'." if key == "params" else "Unknown field."] for key in unknown
            })
        adapter = ENVIRONMENT_KINDS[data["kind"]].adapter_entrypoint
        if adapter is None and not data["entrypoint"]:
            raise serializers.ValidationError({"entrypoint": [f"Kind '{data['kind']}' needs 'module:Class'."]})
        if adapter is not None and data["entrypoint"] not in ("", adapter):
            raise serializers.ValidationError(
                {"entrypoint": [f"Kind '{data['kind']}' always loads {adapter}; leave it out."]}
            )
        return data

    def to_spec(self, *, name: str) -> EnvironmentSpec:
        data = self.validated_data
        return EnvironmentSpec(
            name=name,
            kind=data["kind"],
            entrypoint=data["entrypoint"],
            settings=data["settings"],
            tools=tuple(ToolSchema(**tool) for tool in data["tools"]),
            tool_server=data["tool_server"],
            max_concurrent_episodes=data["max_concurrent_episodes"],
        )

    def secret_settings_sent(self) -> dict[str, str] | None:
        """The secret settings sent; None if the request sent none (a new version then keeps the latest's)."""
        return self.validated_data.get("secret_settings")


class EnvironmentRegisterSerializer(EnvironmentVersionRegisterSerializer):
    project = serializers.IntegerField(
        required=False, allow_null=True, help_text="Defaults to the caller's only project."
    )
    name = serializers.CharField(max_length=100)


class EnvironmentProbeSerializer(serializers.ModelSerializer):
    class Meta:
        model = EnvironmentProbe
        fields = ["id", "purpose", "status", "checks", "worker", "requested_at", "finished_at",
                  "duration_s", "baseline_request", "baseline"]


class EnvironmentProbeRequestSerializer(serializers.Serializer):
    """A requested probe: the checks, and optionally the imported model's baseline."""

    baseline = serializers.DictField(required=False, allow_null=True, default=None, help_text=BASELINE_HELP)

    def validate(self, data):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
        return data


class EnvironmentVersionStatusSerializer(serializers.ModelSerializer):
    """A version's number and whether runs may use it; runs show it too."""

    dispatchable = serializers.BooleanField(source="is_dispatchable")

    class Meta:
        model = EnvironmentVersion
        fields = ["id", "number", "status", "status_reason", "status_changed_at", "dispatchable"]


class EnvironmentVersionSerializer(EnvironmentVersionStatusSerializer):
    created_by = serializers.CharField(source="created_by.username", default=None)
    episode_limit = serializers.IntegerField(
        read_only=True, allow_null=True,
        help_text="The limit producers hold to: max_concurrent_episodes, or "
        "advertised_max_concurrent_episodes when that is smaller; null: none.",
    )

    class Meta(EnvironmentVersionStatusSerializer.Meta):
        fields = [*EnvironmentVersionStatusSerializer.Meta.fields, "kind", "entrypoint",
                  "settings", "secret_setting_names", "tools", "tool_server", "max_concurrent_episodes",
                  "advertised_max_concurrent_episodes", "episode_limit", "created_by", "created_at"]


class EnvironmentVersionDetailSerializer(EnvironmentVersionSerializer):
    environment = serializers.IntegerField(source="environment_id")
    name = serializers.CharField(source="environment.name")
    probes = serializers.SerializerMethodField()

    class Meta(EnvironmentVersionSerializer.Meta):
        fields = ["environment", "name", *EnvironmentVersionSerializer.Meta.fields, "probes"]

    def get_probes(self, version: EnvironmentVersion) -> list[dict]:
        return EnvironmentProbeSerializer(self.context["probes"], many=True).data


class EnvironmentSerializer(serializers.ModelSerializer):
    """An environment with its latest version; ``versions`` must be prefetched newest first."""

    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Environment
        fields = ["id", "project", "name", "created_at", "latest_version"]

    def get_latest_version(self, environment: Environment) -> dict | None:
        versions = environment.versions.all()
        return EnvironmentVersionSerializer(versions[0]).data if versions else None


class EnvironmentDetailSerializer(EnvironmentSerializer):
    versions = EnvironmentVersionSerializer(many=True)

    class Meta(EnvironmentSerializer.Meta):
        fields = [*EnvironmentSerializer.Meta.fields, "versions"]
