"""Environments: the interface every one implements, its checks, loading, tool calls, adapters.

This is the package's public face: the processes (``workers``, ``trainer``)
import from here, never from its modules. Entrypoint strings
(``environments.builtin.calculator:CalculatorEnvironment``, an adapter's in
``tandem.contracts.ENVIRONMENT_KINDS``) name modules on purpose: producers load
them by name.

- the interface: :class:`Environment`, :class:`StepResult`, :class:`Tool`,
  :class:`Demonstration` and :class:`DemonstrationTurn`;
- the checks of what an environment returns (``checked_*``), which raise
  :class:`MalformedOutputError`;
- loading a registration's class: :func:`load_environment_class`, which wraps a
  class that only has the interface's methods, and :func:`as_step_result`;
- tool-call parsing of the policy's text: :func:`parse_tool_calls`;
- the HTTP adapter's session, shared by the episodes of one event loop.
"""

from environments.adapters.http import SharedHTTPSession, shared_http_session
from environments.base import (
    Demonstration,
    DemonstrationTurn,
    Environment,
    MalformedOutputError,
    StepResult,
    Tool,
    checked_json,
    checked_observation,
    checked_step_result,
)
from environments.loading import EnvironmentLoadError, as_step_result, load_environment_class
from environments.tool_calls import ToolCall, ToolCallParse, parse_tool_call, parse_tool_calls

__all__ = [
    "Demonstration",
    "DemonstrationTurn",
    "Environment",
    "EnvironmentLoadError",
    "MalformedOutputError",
    "SharedHTTPSession",
    "StepResult",
    "Tool",
    "ToolCall",
    "ToolCallParse",
    "as_step_result",
    "checked_json",
    "checked_observation",
    "checked_step_result",
    "load_environment_class",
    "parse_tool_call",
    "parse_tool_calls",
    "shared_http_session",
]
