"""Resolve an environment registration to a class, with errors that say what is wrong.

An entrypoint names either a :class:`~environments.base.Environment`
subclass or any class with the same methods (``sample_task(rng)``, async
``reset(task)`` and async ``step(action)``) that never imported Tandem: a
team's existing environment, unchanged. Such a class is wrapped: its ``step``
may return a :class:`StepResult`, an ``(observation, reward, done, info)``
tuple or a mapping with those keys, and its optional ``tools``, ``close``,
``demonstrations`` and ``sample_evaluation_task`` are used when it has them.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import random
from collections.abc import Mapping
from typing import Any

from environments.base import Environment, MalformedOutputError, StepResult
from environments.mcp_tools import with_mcp_tools
from tandem.allowlists.environment_modules import EnvironmentModuleRefused, check_environment_target
from tandem.allowlists.environment_urls import (
    MCP_SERVER_URL_SCHEMES,
    check_environment_url,
    configured_allowlist,
)
from tandem.allowlists.mcp_servers import check_mcp_server
from tandem.contracts import ADAPTER_ENTRYPOINTS, EnvironmentSpec

_REQUIRED = {"sample_task": False, "reset": True, "step": True}  # method: must be async


class EnvironmentLoadError(RuntimeError):
    pass


def load_environment_class(spec: EnvironmentSpec) -> type[Environment]:
    """The class of ``spec``: an adapter, or a class of an allowed module; nothing else is imported. With a
    ``tool_server``, its episodes also take that MCP server's tools (environments/mcp_tools.py).

    Raises:
      EnvironmentLoadError: the entrypoint is malformed, its module is not one the operator
        allows (tandem.allowlists.environment_modules; checked before any import), it is no environment,
        or its tool server is not one the operator lists (TANDEM_MCP_SERVERS).
    """
    cls = _environment_class(spec)
    if spec.tool_server is None:
        return cls
    try:
        if spec.tool_server.command is not None:
            check_mcp_server(spec.tool_server.command)
        else:
            check_environment_url(spec.tool_server.url, allowlist=configured_allowlist(),
                                  schemes=MCP_SERVER_URL_SCHEMES)
    except ValueError as exc:  # McpServerRefused, EnvironmentURLRefused, or a malformed TANDEM_MCP_SERVERS
        raise EnvironmentLoadError(f"tool_server: {exc}") from None
    return with_mcp_tools(cls, spec.tool_server)


def _environment_class(spec: EnvironmentSpec) -> type[Environment]:
    module_name, _, class_name = spec.entrypoint.partition(":")
    if not module_name or not class_name:
        raise EnvironmentLoadError(f"entrypoint {spec.entrypoint!r} is not of the form module:Class")
    # The adapters are Tandem's own code and check their settings themselves.
    if spec.entrypoint not in ADAPTER_ENTRYPOINTS.values():
        try:
            check_environment_target(spec.entrypoint)
        except EnvironmentModuleRefused as exc:
            raise EnvironmentLoadError(f"entrypoint: {exc}") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvironmentLoadError(f"cannot import {module_name!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if isinstance(cls, type) and issubclass(cls, Environment):
        return cls
    if not isinstance(cls, type):
        raise EnvironmentLoadError(f"{spec.entrypoint!r} is not a class")
    missing = [
        f"{'async ' if must_be_async else ''}{name}()" for name, must_be_async in _REQUIRED.items()
        if not callable(getattr(cls, name, None))
        or must_be_async and not inspect.iscoroutinefunction(getattr(cls, name))
    ]
    if missing:
        raise EnvironmentLoadError(
            f"{spec.entrypoint!r} is neither a environments.Environment subclass nor a class with "
            f"its methods: it lacks {', '.join(missing)}"
        )
    return _conforming(cls)


def as_step_result(value: Any) -> StepResult:
    """A step's answer as a StepResult: one already, an (observation, reward, done[, info]) tuple, or a mapping."""
    if isinstance(value, StepResult):
        return value
    if isinstance(value, tuple) and len(value) in (3, 4):
        observation, reward, done, *info = value
        return StepResult(observation=observation, reward=reward, done=done, info=info[0] if info else {})
    if isinstance(value, Mapping) and {"observation", "reward", "done"} <= value.keys():
        return StepResult(observation=value["observation"], reward=value["reward"], done=value["done"],
                          info=value.get("info", {}))
    raise MalformedOutputError(
        f"step returned a {type(value).__name__}, expected StepResult, an (observation, reward, done, info) "
        "tuple or a mapping with those keys"
    )


@functools.cache
def _conforming(cls: type) -> type[Environment]:
    """An Environment subclass that runs an instance of ``cls`` (built with the registration's settings)."""

    class Conforming(Environment):
        def __init__(self, **settings: Any):
            self.wrapped = cls(**settings)
            self.tools = tuple(getattr(self.wrapped, "tools", ()))

        def sample_task(self, rng: random.Random) -> dict[str, Any]:
            return self.wrapped.sample_task(rng)

        def sample_evaluation_task(self, rng: random.Random) -> dict[str, Any]:
            own = getattr(self.wrapped, "sample_evaluation_task", None)
            return own(rng) if callable(own) else self.wrapped.sample_task(rng)

        async def reset(self, task: dict[str, Any]) -> str:
            return await self.wrapped.reset(task)

        async def step(self, action: str) -> StepResult:
            return as_step_result(await self.wrapped.step(action))

        def demonstrations(self, count: int, rng: random.Random):
            own = getattr(self.wrapped, "demonstrations", None)
            return own(count, rng) if callable(own) else []

        async def close(self) -> None:
            own = getattr(self.wrapped, "close", None)
            if callable(own) and inspect.isawaitable(result := own()):
                await result

    Conforming.__name__ = Conforming.__qualname__ = cls.__name__
    Conforming.__module__ = cls.__module__
    Conforming.__doc__ = cls.__doc__
    return Conforming
