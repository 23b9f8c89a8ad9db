"""Environment kinds, a registered environment version's spec (as producers and probes read it), episode close reasons."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, SecretStr, model_validator

from tandem.contracts.schema import Record


class EpisodeCloseReason(StrEnum):
    """Why an episode ended, as an environment is told when it is closed (``POST /close``'s ``reason``)."""

    DONE = "done"  # the environment answered done
    TRUNCATED = "truncated"  # the conversation budget (max_seq_len) cut it off
    MAX_TURNS = "max_turns"  # max_turns came before the environment ended it
    FAILED = "failed"  # a fault: a call that raised, timed out or broke the interface, or generation
    CANCELLED = "cancelled"  # its task was cancelled or ran past its time limit
    PROBE = "probe"  # the conformance probe's one episode


@dataclass(frozen=True)
class RequiredSetting:
    """A setting an environment kind cannot work without: a non-empty string."""

    key: str
    # How a refused registration describes it: "Kind 'http' needs <what>."
    what: str


@dataclass(frozen=True)
class EnvironmentKindDefinition:
    """What a kind of environment is: how people see it, what producers load, what it needs."""

    label: str
    # `module:Class` of the adapter producers load for it; None: the registration names its own class.
    adapter_entrypoint: str | None
    required_settings: tuple[RequiredSetting, ...] = ()
    # Settings of which a registration gives exactly one (an agent's `url` or `command`).
    exactly_one_of: tuple[RequiredSetting, ...] = ()


#: Every kind of environment there is. The platform's choices, its registration
#: checks and the spec's own checks derive from it: a new adapter is its module
#: and one entry here.
ENVIRONMENT_KINDS: dict[str, EnvironmentKindDefinition] = {
    "python": EnvironmentKindDefinition(label="Python class (module:Class)", adapter_entrypoint=None),
    "http": EnvironmentKindDefinition(
        label="HTTP protocol",
        adapter_entrypoint="environments.adapters.http:RemoteHTTPEnvironment",
        required_settings=(RequiredSetting("url", "the server's base URL, e.g. http://host:8765"),),
    ),
    "openenv": EnvironmentKindDefinition(
        label="OpenEnv server",
        adapter_entrypoint="environments.adapters.openenv:OpenEnvEnvironment",
        required_settings=(RequiredSetting("url", "the OpenEnv server's URL, e.g. http://host:8000"),),
    ),
    "gymnasium": EnvironmentKindDefinition(
        label="Gymnasium-style text environment",
        adapter_entrypoint="environments.adapters.gymnasium_text:GymnasiumTextEnvironment",
        required_settings=(RequiredSetting("factory", "'module:callable' building the environment"),),
    ),
    "reasoning_gym": EnvironmentKindDefinition(
        label="reasoning-gym task",
        adapter_entrypoint="environments.adapters.reasoning_gym:ReasoningGymEnvironment",
        required_settings=(RequiredSetting("dataset", "a reasoning-gym dataset name"),),
    ),
    "agent": EnvironmentKindDefinition(
        label="Agent program (an OpenAI-compatible endpoint per episode)",
        adapter_entrypoint="environments.adapters.agent:AgentProgramEnvironment",
        exactly_one_of=(
            RequiredSetting("url", "an agent service's base URL (it serves POST /episodes), e.g. http://host:9000"),
            RequiredSetting("command", "a name of the operator's TANDEM_AGENT_COMMANDS: the program each "
                                       "episode runs"),
        ),
    ),
}

EnvironmentKind = Literal[tuple(ENVIRONMENT_KINDS)]

#: The class producers load for each kind that is an adapter; a 'python' registration names its own class.
ADAPTER_ENTRYPOINTS: dict[str, str] = {
    kind: definition.adapter_entrypoint
    for kind, definition in ENVIRONMENT_KINDS.items()
    if definition.adapter_entrypoint is not None
}


#: Where the built-in environments and adapters lived before their package moved (schema 3):
#: a record written before names the old module, which no longer exists.
MOVED_ENVIRONMENT_MODULES: dict[str, str] = {
    "workers.environments.calculator": "environments.builtin.calculator",
    "workers.environments.guessing_game": "environments.builtin.guessing_game",
    "workers.environments.http": "environments.adapters.http",
    "workers.environments.openenv": "environments.adapters.openenv",
    "workers.environments.gymnasium_text": "environments.adapters.gymnasium_text",
    "workers.environments.reasoning_gym": "environments.adapters.reasoning_gym",
}


def moved_entrypoint(entrypoint: str) -> str:
    """``entrypoint`` with a module from before the move replaced by its new home."""
    module, separator, name = entrypoint.partition(":")
    return MOVED_ENVIRONMENT_MODULES.get(module, module) + separator + name


def environment_kind_choices() -> list[tuple[str, str]]:
    """``(kind, label)`` of every kind: the platform's choices.

    A callable rather than a list, so that Django's migrations store a reference
    to it and a new kind needs no migration of choices. Migrations import it as
    ``tandem.contracts.environments.environment_kind_choices``: it stays there.
    """
    return [(kind, definition.label) for kind, definition in ENVIRONMENT_KINDS.items()]


class ToolSchema(BaseModel):
    """A tool an environment declares: its name and the JSON schema of its arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    parameters: dict = Field(description="JSON schema of the arguments (an object schema).")


class ProbeToolCall(BaseModel):
    """A call of a tool that the probe makes, when a registration asks for it: its name and arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=100)
    arguments: dict = Field(default_factory=dict)


class ToolServerSpec(BaseModel):
    """An MCP server an environment takes tools from, besides any of its own (environments/mcp_tools.py):
    exactly one of an operator-allowed stdio ``command`` and a streamable-HTTP ``url``.

    Each episode opens its own connection and closes it at the episode's end: a stdio server is started
    and stopped with it, so a stateful one never carries one episode's state into another; over HTTP the
    protocol has no sessions, so what a server keeps is its own, across episodes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | None = Field(
        None, min_length=1, max_length=64,
        description="A name of the operator's TANDEM_MCP_SERVERS (name to argv): the server a worker starts. "
        "A registration never gives a command line itself.")
    url: str | None = Field(
        None, min_length=1, max_length=2048,
        description="The endpoint of a streamable-HTTP MCP server (http or https), under the same address "
        "rules as HTTP environments' URLs (TANDEM_ENVIRONMENT_URL_ALLOWLIST), checked again at each "
        "connection.")

    probe_calls: tuple[ProbeToolCall, ...] = Field(
        (), max_length=8,
        description="Calls of the server's tools that the probe and health checks make, each to answer without "
        "an error. None by default: a probe lists the tools and calls none, since a call may change what the "
        "server holds.")

    @model_validator(mode="after")
    def _one_transport(self) -> ToolServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("a tool server has exactly one of `command` (stdio) and `url` (streamable HTTP)")
        return self

    @property
    def label(self) -> str:
        """How logs and errors name the server."""
        return self.command or self.url or ""


class EnvironmentSpec(Record):
    """One immutable version of a registered environment, as producers and probes need it.

    Schema 2 added ``version``, ``version_id``, ``tools`` and the adapter kinds;
    a schema 1 record (kind 'python', no version) is read as version 0. Schema 3
    renamed ``params`` to ``settings``, the API's name for them; a record of an
    older schema is read with its ``params`` as ``settings``. Schema 4 added
    ``tool_server``; an older record has none. Schema 5 let a tool server be a ``url``; a schema 4
    record's is a command. Schema 6 added the tool server's ``probe_calls``; an older record asks none.
    """

    readable_schema_versions: ClassVar[frozenset[int]] = frozenset({1, 2, 3, 4, 5, 6})
    schema_version: int = 6

    name: str = Field(description="Registered name, unique within a project.")
    version: int = Field(
        0, ge=0, description="Registry version number (1, 2 ...); 0: not from the registry."
    )
    version_id: int | None = Field(
        None, description="Registry id of the version; names its dispatch pause flag in Redis."
    )
    kind: EnvironmentKind = Field(
        description="How producers load it. 'python': a class named by `entrypoint`; the other "
        "kinds are adapters (ENVIRONMENT_KINDS) configured by `settings`."
    )
    entrypoint: str = Field(
        "", description="`module:Class` implementing environments.Environment; "
        "filled in from the kind for adapters."
    )
    settings: dict = Field(
        default_factory=dict, description="The registered settings: keyword arguments for the class."
    )
    tools: tuple[ToolSchema, ...] = Field(
        (), description="Tools the environment must expose, exactly; the probe checks them."
    )
    secret_setting_names: tuple[str, ...] = Field(
        (), description="Names of the version's secret settings (keyword arguments too); their values never "
        "travel in a spec, only to producers and probes (EnvironmentSecrets)."
    )
    tool_server: ToolServerSpec | None = Field(
        None, description="An MCP server the environment takes tools from, per episode; its tools are "
        "declared in `tools` like any other, and the probe checks them."
    )
    max_concurrent_episodes: int | None = Field(
        None, ge=1, description="At most this many episodes of the version run at once, across every "
        "producer on every host (workers/episode_slots.py); an episode waits for a slot. None: no limit. "
        "The registration's limit, or the server's advertised capacity when that is smaller."
    )

    @model_validator(mode="before")
    @classmethod
    def _upgrade_and_fill_adapter(cls, data):
        if isinstance(data, dict):
            if data.get("schema_version") in (1, 2):
                data = {**data, "schema_version": 6,
                        "entrypoint": moved_entrypoint(data.get("entrypoint") or "")}
            elif data.get("schema_version") in (3, 4, 5):
                data = {**data, "schema_version": 6}
            if "params" in data and "settings" not in data:
                # Written by a process from before schema 3 (a RunSpec or ProbeRequest in Redis).
                data = {key: value for key, value in data.items() if key != "params"} | {
                    "settings": data["params"]
                }
            adapter = ADAPTER_ENTRYPOINTS.get(data.get("kind", ""))
            if adapter is not None and not data.get("entrypoint"):
                data = {**data, "entrypoint": adapter}
        return data

    @model_validator(mode="after")
    def _entrypoint_fits_kind(self):
        adapter = ADAPTER_ENTRYPOINTS.get(self.kind)
        if adapter is not None and self.entrypoint != adapter:
            raise ValueError(f"kind {self.kind!r} always loads {adapter}, not {self.entrypoint!r}")
        if adapter is None and not self.entrypoint:
            raise ValueError("kind 'python' needs an entrypoint 'module:Class'")
        return self

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}" if self.version else self.name


def _reveal(values: dict[str, SecretStr]) -> dict[str, str]:
    return {name: value.get_secret_value() for name, value in values.items()}


#: Secret settings, name -> value. In memory each value is a SecretStr, so that a repr
#: (a log line, a traceback's locals) shows '**********'; only a JSON dump, the write to
#: Redis, reveals them.
SecretSettingValues = Annotated[dict[str, SecretStr], PlainSerializer(_reveal, when_used="json")]


class EnvironmentSecrets(Record):
    """The secret settings of an environment version, which the platform writes for workers only.

    Under a run's :func:`~tandem.contracts.keys.run_environment_secrets_key` from its claim
    until it stops its producers, and a probe's
    :func:`~tandem.contracts.keys.probe_environment_secrets_key` until the probe is
    reported. The trainer is never sent them: its claim carries only
    ``EnvironmentSpec.secret_setting_names``. In Redis it is sealed: a Fernet token of this
    JSON (``tandem.runtime.secrets_at_rest.environment_secrets_seal``), which workers open with
    ``TANDEM_SECRETS_KEY``.
    """

    version_id: int = Field(description="The version they belong to.")
    settings: SecretSettingValues = Field(
        default_factory=dict, description="Keyword arguments merged over the spec's settings."
    )

    def revealed(self) -> dict[str, str]:
        return _reveal(self.settings)


def episode_limit(*limits: int | None) -> int | None:
    """The limit on concurrent episodes that holds: the smallest of ``limits`` given (a registration's,
    a server's advertised capacity); None when none is."""
    return min((limit for limit in limits if limit is not None), default=None)
