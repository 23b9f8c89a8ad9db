"""Environments served by OpenEnv (``pip install openenv-core``), over its WebSocket session API.

OpenEnv actions and observations are JSON objects; Tandem's are text. The
policy's text becomes the action ``{action_field: text}``; the observation
shown to the policy is ``observation[observation_field]``, or, when
``observation_field`` is None, the observation object as JSON (without
``reward``, ``done`` and ``metadata``, which OpenEnv reports separately). A
task is a seed passed to OpenEnv's ``reset``, so a GRPO group shares it when
the server's environment honours seeds.

One WebSocket session per episode: OpenEnv servers keep an environment
instance per connection, so concurrent episodes never share state.
"""

from __future__ import annotations

import json
import random
from typing import Any

from environments.base import Environment, StepResult

_REPORTED_SEPARATELY = {"reward", "done", "metadata"}


class OpenEnvError(RuntimeError):
    """The OpenEnv server's answer cannot become a Tandem observation."""


class OpenEnvEnvironment(Environment):
    """Registration: entrypoint ``environments.adapters.openenv:OpenEnvEnvironment``, settings
    ``{"url": "http://host:8000", "action_field": "message", "observation_field": "echoed_message",
    "timeout_s": 30, "max_observation_chars": 8192}``."""

    def __init__(self, *, url: str, action_field: str = "message", observation_field: str | None = None,
                 timeout_s: float = 30.0, max_observation_chars: int = 8192):
        self.url = url.rstrip("/")
        self.action_field = action_field
        self.observation_field = observation_field
        self.timeout_s = timeout_s
        self.max_observation_chars = max_observation_chars
        self._client: Any = None

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"seed": rng.randrange(2**31)}

    def _text(self, observation: Any, where: str) -> str:
        if not isinstance(observation, dict):
            raise OpenEnvError(f"{where}: observation is {type(observation).__name__}, expected an object")
        if self.observation_field is None:
            visible = {k: v for k, v in observation.items() if k not in _REPORTED_SEPARATELY}
            text = json.dumps(visible, sort_keys=True) + "\n"
        elif self.observation_field not in observation:
            raise OpenEnvError(f"{where}: observation has no {self.observation_field!r}: {sorted(observation)}")
        else:
            text = str(observation[self.observation_field])
        if len(text) > self.max_observation_chars:
            raise OpenEnvError(f"{where}: observation of {len(text)} chars exceeds max_observation_chars="
                               f"{self.max_observation_chars}")
        return text

    async def reset(self, task: dict[str, Any]) -> str:
        from openenv.core.generic_client import GenericEnvClient

        self._client = GenericEnvClient(base_url=self.url, connect_timeout_s=self.timeout_s,
                                        message_timeout_s=self.timeout_s)
        await self._client.connect()
        result = await self._client.reset(seed=task.get("seed"))
        return self._text(result.observation, "reset")

    async def step(self, action: str) -> StepResult:
        if self._client is None:
            raise RuntimeError("step() called before reset()")
        result = await self._client.step({self.action_field: action})
        reward = result.reward
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
            raise OpenEnvError(f"step: reward is {type(reward).__name__}, expected a number")
        observation = result.observation
        return StepResult(self._text(observation, "step"), float(reward or 0.0), bool(result.done),
                          dict(observation.get("metadata") or {}))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
