"""An agent program as an environment: a team's own agent runs each episode, calling the policy through
an OpenAI-compatible endpoint that the producer serves for that episode alone (workers/agent_endpoint.py).

Registration: kind ``agent``, with exactly one of these settings:

- ``url``: an agent service. For each episode the producer sends ``POST {url}/episodes`` with
  ``{"episode_id": str, "task": {...}, "base_url": str, "api_key": str, "model": str}`` and waits for
  ``{"reward": float}`` (or ``{}`` when the agent made a reward call). The URL is under the rules of
  HTTP environments (``TANDEM_ENVIRONMENT_URL_ALLOWLIST``), checked again at each connection.
- ``command``: a name of the operator's ``TANDEM_AGENT_COMMANDS`` (name to argv). The producer runs it
  once per episode, without a shell, with an environment of only ``OPENAI_BASE_URL``,
  ``OPENAI_API_KEY``, ``TANDEM_MODEL``, ``TANDEM_TASK`` (the task as JSON), ``PATH`` and ``HOME``: the
  ``openai`` client needs no argument. It reports its reward with a reward call.

The reward call is ``POST {base_url}/reward`` with ``{"reward": float}`` and the episode's key. Other
settings: ``timeout_s`` (default 300), how long an episode's agent may run.

Tasks are seeds, like an HTTP environment's: ``{"seed": n}``, training seeds below
:data:`~environments.base.EVALUATION_SEED_BASE`, held-out ones above; every episode of a GRPO group
gets the same one, and the agent derives its problem from it.

An agent that exits with an error, runs past ``timeout_s``, answers outside this protocol or never
calls its endpoint fails its episode with that reason (:class:`AgentProgramError`), and the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
from dataclasses import dataclass
from typing import Any

import aiohttp

from environments.adapters.http import (
    SharedHTTPSession,
    checked_remote_url,
    error_message_excerpt,
    shared_http_session,
)
from environments.base import (
    Environment,
    MalformedOutputError,
    StepResult,
    evaluation_seed,
    training_seed,
)
from tandem.allowlists.agent_commands import check_agent_command

# Enough of an agent's error output to act on.
_ERROR_TAIL_CHARS = 600
# The variables of the worker an agent program inherits: where programs are, and a home. Nothing else
# (the worker's Redis URL, keys and secret settings stay out of it).
_INHERITED_VARIABLES = ("PATH", "HOME", "LANG", "TMPDIR")


class AgentProgramError(RuntimeError):
    """The agent program failed its episode: it exited with an error, timed out, or broke the protocol."""


@dataclass(frozen=True)
class AgentEndpointAccess:
    """What an agent needs to reach its episode's endpoint; the key is valid for that episode alone."""

    episode_id: str
    base_url: str
    api_key: str
    model: str


class AgentProgramEnvironment(Environment):
    """Registration: kind ``agent``, settings ``{"url": ...}`` or ``{"command": ...}``, optional ``timeout_s``."""

    def __init__(self, *, url: str | None = None, command: str | None = None, timeout_s: float = 300.0):
        if (url is None) == (command is None):
            raise ValueError("an agent environment needs exactly one of the settings `url` (an agent service) "
                             "and `command` (a name of TANDEM_AGENT_COMMANDS)")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.url: str | None = None
        self.argv: tuple[str, ...] | None = None
        if url is not None:
            self.url = checked_remote_url(url)
        else:
            self.argv = check_agent_command(command)
        self.command = command

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"seed": training_seed(rng)}

    def sample_evaluation_task(self, rng: random.Random) -> dict[str, Any]:
        return {"seed": evaluation_seed(rng)}

    async def reset(self, task: dict[str, Any]) -> str:
        raise MalformedOutputError("an agent environment's episodes run its agent program; it has no reset")

    async def step(self, action: str) -> StepResult:
        raise MalformedOutputError("an agent environment's episodes run its agent program; it has no step")

    @property
    def label(self) -> str:
        """How reasons name the agent."""
        return f"agent service {self.url}" if self.url is not None else f"agent program {self.command!r}"

    async def run_agent(self, task: dict[str, Any], access: AgentEndpointAccess) -> float | None:
        """Run the agent on ``task`` until it ends; the reward its service answered with, or None (a reward
        call is then expected). Raises AgentProgramError when it fails; never runs past ``timeout_s``."""
        try:
            if self.url is not None:
                return await asyncio.wait_for(self._post_episode(task, access), self.timeout_s)
            await self._run_command(task, access)
            return None
        except TimeoutError:
            raise AgentProgramError(f"the {self.label} did not finish within timeout_s={self.timeout_s:g}s") from None

    async def _post_episode(self, task: dict[str, Any], access: AgentEndpointAccess) -> float | None:
        shared = shared_http_session.get()
        own = None if shared is not None else SharedHTTPSession()
        session = (shared or own).session()
        body = {"episode_id": access.episode_id, "task": task, "base_url": access.base_url,
                "api_key": access.api_key, "model": access.model}
        try:
            async with session.post(f"{self.url}/episodes", json=body) as response:
                raw = await response.read()
                if response.status != 200:
                    message = error_message_excerpt(raw)
                    raise AgentProgramError(f"the {self.label} answered POST /episodes with HTTP {response.status}"
                                            + (f": {message}" if message is not None else ""))
        except aiohttp.ClientError as exc:
            raise AgentProgramError(f"the {self.label} could not be reached: {type(exc).__name__}: {exc}") from None
        finally:
            if own is not None:
                await own.aclose()
        try:
            payload = json.loads(raw)
        except ValueError:
            raise AgentProgramError(f"the {self.label} answered POST /episodes with no JSON object") from None
        if not isinstance(payload, dict):
            raise AgentProgramError(f"the {self.label} answered POST /episodes with no JSON object")
        reward = payload.get("reward")
        if reward is None:
            return None
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise AgentProgramError(f"the {self.label}'s reward is {reward!r}, expected a number")
        return float(reward)

    async def _run_command(self, task: dict[str, Any], access: AgentEndpointAccess) -> None:
        environment = {name: os.environ[name] for name in _INHERITED_VARIABLES if name in os.environ}
        environment |= {"OPENAI_BASE_URL": access.base_url, "OPENAI_API_KEY": access.api_key,
                        "TANDEM_MODEL": access.model, "TANDEM_TASK": json.dumps(task)}
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv, env=environment, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise AgentProgramError(f"the {self.label} could not start: {exc}") from None
        try:
            _, stderr = await asyncio.wait_for(process.communicate(), self.timeout_s)
        except BaseException:
            # A timeout, or the episode cancelled: the program and anything it started go with it.
            _kill_group(process)
            await process.wait()
            raise
        if process.returncode != 0:
            tail = stderr.decode(errors="replace")[-_ERROR_TAIL_CHARS:].strip().replace(access.api_key, "***")
            raise AgentProgramError(f"the {self.label} exited with status {process.returncode}"
                                    + (f": {tail}" if tail else ""))


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
