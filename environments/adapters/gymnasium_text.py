"""Gymnasium-style text environments: any object with ``reset``/``step`` over strings.

The wrapped object follows the Gymnasium API with text spaces::

    reset(seed=None, options=None) -> (observation: str, info: dict)
    step(action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict)

It is synchronous, so each call runs in a worker thread and the producer's
event loop keeps generating for other episodes meanwhile. A task is a seed
(and optional reset options) drawn by ``sample_task``; every episode of a
group resets with the same seed. ``factory`` names a callable, usually the
class, as ``module:callable``; ``factory_kwargs`` are passed to it. Its module
must be one the operator allows (``TANDEM_ENVIRONMENT_MODULES``, see
:mod:`tandem.allowlists.environment_modules`): it is checked before anything is imported,
since a factory is any callable (``os:system`` would run a shell command).
"""

from __future__ import annotations

import asyncio
import importlib
import random
from typing import Any

from environments.base import Environment, StepResult, evaluation_seed, training_seed
from tandem.allowlists.environment_modules import EnvironmentModuleRefused, check_environment_target


class GymnasiumTextEnvironment(Environment):
    """Registration: entrypoint ``environments.adapters.gymnasium_text:GymnasiumTextEnvironment``,
    settings ``{"factory": "my_package.envs:WordleEnv", "factory_kwargs": {...}, "reset_options": {...}}``."""

    def __init__(self, *, factory: str, factory_kwargs: dict[str, Any] | None = None,
                 reset_options: dict[str, Any] | None = None):
        try:
            module_name = check_environment_target(factory)
        except EnvironmentModuleRefused as exc:
            raise ValueError(f"settings.factory: {exc}") from None
        attribute = factory.partition(":")[2]
        self._factory = getattr(importlib.import_module(module_name), attribute)
        if not callable(self._factory):
            raise ValueError(f"factory {factory!r} is not callable")
        self.factory_kwargs = dict(factory_kwargs or {})
        self.reset_options = reset_options
        self._env: Any = None

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"seed": training_seed(rng)}

    def sample_evaluation_task(self, rng: random.Random) -> dict[str, Any]:
        return {"seed": evaluation_seed(rng)}

    async def reset(self, task: dict[str, Any]) -> str:
        # Built here, not in __init__: producers create an instance just to sample a task.
        self._env = await asyncio.to_thread(self._factory, **self.factory_kwargs)
        observation, info = await asyncio.to_thread(
            self._env.reset, seed=task.get("seed"), options=task.get("options", self.reset_options)
        )
        if not isinstance(observation, str):
            raise TypeError(f"reset returned a {type(observation).__name__} observation, expected str")
        return observation

    async def step(self, action: str) -> StepResult:
        if self._env is None:
            raise RuntimeError("step() called before reset()")
        observation, reward, terminated, truncated, info = await asyncio.to_thread(self._env.step, action)
        if not isinstance(observation, str):
            raise TypeError(f"step returned a {type(observation).__name__} observation, expected str")
        info = dict(info or {})
        info.setdefault("terminated", bool(terminated))
        info.setdefault("truncated", bool(truncated))
        return StepResult(str(observation), float(reward), bool(terminated or truncated), info)

    async def close(self) -> None:
        if self._env is not None and callable(getattr(self._env, "close", None)):
            await asyncio.to_thread(self._env.close)
        self._env = None
