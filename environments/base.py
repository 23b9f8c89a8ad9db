"""The interface every environment implements, in-process or behind an adapter.

An environment owns the task and the reward. Tools are separate: the agent
loop parses tool calls out of the policy's text and runs the environment's
declared tools itself, so a tool result becomes an observation without a call
to ``step``. Anything the policy says that is not a tool call is an action for
``step``.
"""

from __future__ import annotations

import abc
import hashlib
import json
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tandem.contracts import EpisodeCloseReason

#: Task seeds are split in two: training draws below this, evaluation at or above it (up to
#: 2**31). An environment whose tasks come from a seed (HTTP, OpenEnv, Gymnasium) keeps its
#: evaluation tasks apart by drawing each split's seeds from its own range.
EVALUATION_SEED_BASE = 2**30


def training_seed(rng: random.Random) -> int:
    """A task seed of the training split, drawn from ``rng``."""
    return rng.randrange(EVALUATION_SEED_BASE)


def evaluation_seed(rng: random.Random) -> int:
    """A task seed of the held-out split, drawn from ``rng``: never one :func:`training_seed` draws."""
    return EVALUATION_SEED_BASE + rng.randrange(2**31 - EVALUATION_SEED_BASE)


def stable_fraction(value: Any) -> float:
    """A number in [0, 1) fixed by ``value``'s JSON, the same in every process (no hash seed)."""
    digest = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def draw_from_split(draw: Callable[[], dict[str, Any]], *, held_out: Callable[[dict[str, Any]], bool],
                    evaluation: bool, attempts: int = 10_000) -> dict[str, Any]:
    """A task from ``draw()`` that is in the evaluation split (``held_out``) if ``evaluation``, else not.

    For an environment's own split of a task space it draws from: redraws until
    the task falls on the wanted side.

    Raises:
      ValueError: no task of that split in ``attempts`` draws (the split is empty).
    """
    for _ in range(attempts):
        task = draw()
        if held_out(task) == evaluation:
            return task
    split = "evaluation" if evaluation else "training"
    raise ValueError(f"no {split} task in {attempts} draws: the task space is too small to split")


@dataclass(frozen=True)
class StepResult:
    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class ToolError(Exception):
    """What a tool raises for a call it cannot serve (an expression it cannot evaluate, an item it does
    not know): the model is told ``error: <message>`` as the tool's answer, and the episode goes on. Any
    other exception from a tool is the environment's fault and fails the episode."""


class MalformedOutputError(ValueError):
    """An environment returned something outside this interface; the message says what and where."""


def checked_observation(value: Any, where: str, *, max_chars: int | None = None) -> str:
    """``value`` if it is an observation: a string of at most ``max_chars``."""
    if not isinstance(value, str):
        raise MalformedOutputError(f"{where} returned a {type(value).__name__} observation, expected str")
    if max_chars is not None and len(value) > max_chars:
        raise MalformedOutputError(f"{where} returned an observation of {len(value)} chars, "
                                   f"more than max_observation_chars={max_chars}")
    return value


def checked_json(value: Any, where: str) -> None:
    """Raise MalformedOutputError unless ``value`` serialises as JSON (tasks and infos cross processes)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise MalformedOutputError(f"{where} is not JSON-serialisable: {exc}") from None


def checked_step_result(result: Any, *, max_observation_chars: int | None = None) -> StepResult:
    """``result`` if it is a well-formed :class:`StepResult`: a finite reward, a bool done, JSON info."""
    if not isinstance(result, StepResult):
        raise MalformedOutputError(f"step returned a {type(result).__name__}, expected StepResult")
    checked_observation(result.observation, "step", max_chars=max_observation_chars)
    reward = result.reward
    # bool is an int in Python; a reward of True is a bug, not 1.0.
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise MalformedOutputError(f"step reward is {reward!r}, expected a finite number")
    if not isinstance(result.done, bool):
        raise MalformedOutputError(f"step done is {type(result.done).__name__}, expected bool")
    if not isinstance(result.info, dict):
        raise MalformedOutputError(f"step info is {type(result.info).__name__}, expected dict")
    checked_json(result.info, "step info")
    return result


@dataclass(frozen=True)
class Tool:
    """A tool the policy may call, declared with a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[dict[str, Any]], Awaitable[str]]


@dataclass(frozen=True)
class DemonstrationTurn:
    """One turn of a demonstration: who speaks, and what they say."""

    role: str  # "policy" (trained on) or "environment" (masked out)
    text: str


@dataclass(frozen=True)
class Demonstration:
    prompt: str
    turns: tuple[DemonstrationTurn, ...]


DEMONSTRATION_ROLES = ("policy", "environment")


def checked_demonstrations(value: Any, where: str = "demonstrations()") -> list[Demonstration]:
    """``value`` as a list if it is demonstrations: each a :class:`Demonstration` of a str prompt
    and turns of a known role and str text."""
    if not isinstance(value, list | tuple):
        raise MalformedOutputError(f"{where} returned a {type(value).__name__}, expected a list of Demonstration")
    for index, demonstration in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(demonstration, Demonstration):
            raise MalformedOutputError(f"{at} is a {type(demonstration).__name__}, expected Demonstration")
        if not isinstance(demonstration.prompt, str):
            raise MalformedOutputError(f"{at}.prompt is a {type(demonstration.prompt).__name__}, expected str")
        for turn_index, turn in enumerate(demonstration.turns):
            if not isinstance(turn, DemonstrationTurn):
                raise MalformedOutputError(f"{at}.turns[{turn_index}] is a {type(turn).__name__}, "
                                           "expected DemonstrationTurn")
            if turn.role not in DEMONSTRATION_ROLES or not isinstance(turn.text, str):
                raise MalformedOutputError(f"{at}.turns[{turn_index}] is ({turn.role!r}, "
                                           f"{type(turn.text).__name__}), expected a role of "
                                           f"{' or '.join(DEMONSTRATION_ROLES)} and str text")
    return list(value)


class Environment(abc.ABC):
    """Subclass this to plug an environment into Tandem.

    One instance serves one episode at a time; producers create one per
    episode, so instance state is episode state.
    """

    #: Tools the policy may call; listed in the prompt.
    tools: tuple[Tool, ...] = ()

    @abc.abstractmethod
    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        """A training task drawn from ``rng``; all episodes of a GRPO group share it.

        It must never be one :meth:`sample_evaluation_task` draws, if that is overridden.
        """

    def sample_evaluation_task(self, rng: random.Random) -> dict[str, Any]:
        """A held-out task drawn from ``rng``, for evaluation only; never trained on.

        By default :meth:`sample_task`, and Tandem keeps the split by the seeds it
        gives ``rng``: evaluation seeds are at or above :data:`EVALUATION_SEED_BASE`,
        training seeds below it. An environment whose tasks are few (so that two
        seeds can draw the same task) overrides both methods with a split of its own,
        as the built-in calculator does.
        """
        return self.sample_task(rng)

    @abc.abstractmethod
    async def reset(self, task: dict[str, Any]) -> str:
        """Start an episode on ``task``; returns the first observation (the prompt)."""

    @abc.abstractmethod
    async def step(self, action: str) -> StepResult:
        """Apply the policy's action (its text, stripped of special tokens)."""

    def demonstrations(self, count: int, rng: random.Random
                       ) -> list[Demonstration] | Awaitable[list[Demonstration]]:
        """At most ``count`` demonstrations for an SFT warm-up; environments without any return [].

        May be a coroutine function: a remote environment fetches its demonstrations.
        """
        return []

    async def close_episode(self, reason: EpisodeCloseReason) -> None:
        """Tell the environment that its episode ended, and why; called once, just before ``close``.

        The agent calls it after every episode that reached the environment,
        whatever the outcome (``reason``), and the probe after its episode
        (``EpisodeCloseReason.PROBE``); a remote environment passes it on to its
        server, which may then release the episode's state. Its failure is
        logged, never the episode's. The default does nothing.
        """
        return None

    async def close(self) -> None:
        """Release what the episode held (connections, threads); called once when it ends.

        The agent calls it after every episode that reached the environment,
        whatever the outcome; the default holds nothing.
        """
        return None
