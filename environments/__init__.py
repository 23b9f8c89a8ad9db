"""Environments: the interface every one implements, its checks, loading, tool calls, adapters.

This is the package's public face: the processes (``workers``, ``trainer``)
import from here, never from its modules. Entrypoint strings
(``environments.builtin.calculator:CalculatorEnvironment``, an adapter's in
``tandem.contracts.ENVIRONMENT_KINDS``) name modules on purpose: producers load
them by name.

- the interface: :class:`Environment`, :class:`StepResult`, :class:`Tool` (whose calls may raise
  :class:`ToolError`), :class:`Demonstration` and :class:`DemonstrationTurn`;
- the checks of what an environment returns (``checked_*``), which raise
  :class:`MalformedOutputError`;
- loading a registration's class: :func:`load_environment_class`, which wraps a
  class that only has the interface's methods, and :func:`as_step_result`;
- tool calls in a model's own format: :func:`parse_tool_calls` reads them,
  :func:`format_tool_call` writes them, :func:`tool_call_format_of_template`
  finds a template's, :func:`tool_schemas` and :func:`tool_instructions` present the
  tools, :func:`demonstration_messages` turns a demonstration into chat messages;
- the HTTP adapter's session, shared by the episodes of one event loop;
- agent programs (kind ``agent``): :class:`AgentProgramEnvironment` runs a team's own agent against an
  endpoint whose :class:`AgentEndpointAccess` the producer gives it, and raises :class:`AgentProgramError`.
"""

from environments.adapters.agent import (
    AgentEndpointAccess,
    AgentProgramEnvironment,
    AgentProgramError,
)
from environments.adapters.http import SharedHTTPSession, shared_http_session
from environments.base import (
    EVALUATION_SEED_BASE,
    Demonstration,
    DemonstrationTurn,
    Environment,
    MalformedOutputError,
    StepResult,
    Tool,
    ToolError,
    checked_demonstrations,
    checked_json,
    checked_observation,
    checked_step_result,
    draw_from_split,
    evaluation_seed,
    stable_fraction,
    training_seed,
)
from environments.loading import EnvironmentLoadError, as_step_result, load_environment_class
from environments.tool_calls import (
    ToolCall,
    ToolCallFormat,
    ToolCallParse,
    demonstration_messages,
    format_tool_call,
    parse_tool_call,
    parse_tool_calls,
    text_outside_calls,
    tool_call_format_of_template,
    tool_instructions,
    tool_schemas,
)

__all__ = [
    "AgentEndpointAccess",
    "AgentProgramEnvironment",
    "AgentProgramError",
    "EVALUATION_SEED_BASE",
    "Demonstration",
    "DemonstrationTurn",
    "Environment",
    "EnvironmentLoadError",
    "MalformedOutputError",
    "SharedHTTPSession",
    "StepResult",
    "Tool",
    "ToolError",
    "ToolCall",
    "ToolCallFormat",
    "ToolCallParse",
    "as_step_result",
    "checked_demonstrations",
    "checked_json",
    "checked_observation",
    "checked_step_result",
    "demonstration_messages",
    "draw_from_split",
    "evaluation_seed",
    "format_tool_call",
    "load_environment_class",
    "parse_tool_call",
    "parse_tool_calls",
    "text_outside_calls",
    "shared_http_session",
    "stable_fraction",
    "tool_call_format_of_template",
    "tool_instructions",
    "tool_schemas",
    "training_seed",
]
