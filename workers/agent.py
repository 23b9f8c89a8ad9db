"""One agent-environment episode: generate, call tools, step, until done.

An episode is one inference session (its trajectory id): the engine keeps the
conversation's KV cache between turns, so each turn only prefills what the
environment added. The session ends with the episode, whatever its outcome.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from environments import (
    AgentProgramEnvironment,
    AgentProgramError,
    Environment,
    MalformedOutputError,
    ToolError,
    checked_observation,
    checked_step_result,
    parse_tool_calls,
)
from policy import (
    ByteLayout,
    ByteTokenizer,
    ChatTemplateError,
    EpisodeTokens,
    PromptFormatError,
    PromptLayout,
    Tokenizer,
    tool_call_parse_formats,
)
from tandem.configs.run import RunConfig
from tandem.contracts import (
    AgentCall,
    ConversationMessage,
    EpisodeCloseReason,
    EpisodeTimings,
    TrajectoryRecord,
)
from workers.activity import WORKER_NAME
from workers.agent_endpoint import (
    AgentEpisode,
    AgentEpisodeResult,
    SamplingPolicy,
    agent_endpoint_server,
)
from workers.circuit_breaker import CircuitBreakers, process_breakers
from workers.policy import BatchingPolicy

logger = logging.getLogger(__name__)
#: Closes (``close_episode`` or ``close``) that raised or timed out in this process, per environment name.
environment_close_failures: collections.Counter[str] = collections.Counter()


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_seq_len: int
    max_new_tokens: int
    environment_timeout_s: float
    # Longest observation (reset, step or tool result) an environment may return.
    max_observation_chars: int = 8192

    @classmethod
    def of_run(cls, config: RunConfig) -> EpisodeLimits:
        """The limits a run's config sets on each of its episodes."""
        return cls(max_turns=config.rollout.max_turns, max_seq_len=config.model.max_seq_len,
                   max_new_tokens=config.sampling.max_new_tokens,
                   environment_timeout_s=config.rollout.environment_timeout_s,
                   max_observation_chars=config.rollout.max_observation_chars)


class EpisodeFailure(Exception):
    """Ends an episode as failed, with a reason that is recorded and shown."""


class EnvironmentFault(EpisodeFailure):
    """An episode failure the environment caused; these count towards its circuit breaker."""


def _call_environment_check(check, value):
    """``check(value)``, a malformed value failing the episode as the environment's fault."""
    try:
        return check(value)
    except MalformedOutputError as exc:
        raise EnvironmentFault(str(exc)) from exc


async def _call_environment(awaitable, *, what: str, timeout_s: float, check=None):
    """The call's result, passed through ``check`` (which raises MalformedOutputError on garbage)."""
    try:
        result = await asyncio.wait_for(awaitable, timeout_s)
        return check(result) if check is not None else result
    except TimeoutError as exc:
        raise EnvironmentFault(f"{what} timed out after {timeout_s:g}s") from exc
    except (EpisodeFailure, ToolError):
        raise
    except MalformedOutputError as exc:
        raise EnvironmentFault(str(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - any environment bug fails only this episode
        raise EnvironmentFault(f"{what} raised {type(exc).__name__}: {exc}") from exc


async def _close_environment(environment: Environment, reason: EpisodeCloseReason, *, environment_name: str,
                             timeout_s: float, redact: Callable[[str], str] | None = None) -> None:
    """Tell the environment why its episode ended, then release what it holds, each within ``timeout_s``.

    A failure of either is logged and counted (:data:`environment_close_failures`), never the
    episode's: its outcome is decided. ``close`` runs even when ``close_episode`` failed.
    """
    for what, closing in (("close_episode", lambda: environment.close_episode(reason)),
                          ("close", environment.close)):
        try:
            await asyncio.wait_for(closing(), timeout_s)
        except Exception as exc:  # noqa: BLE001
            environment_close_failures[environment_name] += 1
            error = f"timed out after {timeout_s:g}s" if isinstance(exc, TimeoutError) \
                else f"{type(exc).__name__}: {exc}"
            logger.warning("environment %s: %s(%s) failed: %s", environment_name, what, reason,
                           redact(error) if redact is not None else error)


def _room_left(episode: EpisodeTokens, limits: EpisodeLimits, layout: PromptLayout) -> int:
    """Tokens left within max_seq_len once the longest next turn is reserved."""
    return limits.max_seq_len - len(episode) - limits.max_new_tokens - layout.turn_overhead


async def run_episode(
    *,
    run_id: int,
    group_id: str,
    group_size: int,
    environment_name: str,
    environment: Environment,
    task: dict[str, Any],
    policy: BatchingPolicy,
    limits: EpisodeLimits,
    tokenizer: Tokenizer | None = None,
    layout: PromptLayout | None = None,
    circuit_breakers: CircuitBreakers | None = None,
    redact: Callable[[str], str] | None = None,
) -> TrajectoryRecord:
    """Run one episode to the end; environment faults end it as ``failed``, never raise.

    ``layout`` renders the conversation (by default the byte layout of
    ``tokenizer``). An episode the conversation budget (``max_seq_len``) cuts
    off, or that reaches ``max_turns`` before the environment ends it, ends
    ``truncated`` with the reward so far and its reason; a prompt that leaves
    no room for one turn fails it. While ``environment_name``'s circuit
    breaker is open (``circuit_breakers``, by default this process's), the
    episode fails at once without touching the environment or the policy.
    ``redact`` rewrites the failure reason before it is recorded anywhere (the
    environment's secret settings out of it: workers/secret_settings.py).
    """
    tokenizer = tokenizer or ByteTokenizer()
    layout = layout or ByteLayout(tokenizer)
    parse_formats = tool_call_parse_formats(layout)
    breakers = process_breakers if circuit_breakers is None else circuit_breakers
    trajectory_id = uuid.uuid4().hex
    started_at = time.time()
    generation_s = environment_s = tool_s = 0.0
    episode = EpisodeTokens(tools=tuple(environment.tools))
    policy_versions: list[int] = []
    agent_calls: tuple[AgentCall, ...] = ()
    newest_version: int | None = None
    reward = 0.0
    status, failure_reason = "ok", ""
    # What the environment is told when the episode ends; anything unforeseen is a failure.
    close_reason = EpisodeCloseReason.FAILED
    environment_verdict: bool | None = None  # True: worked, False: faulted, None: unknown
    circuit_open_reason = breakers.admit(environment_name)

    def truncated(reason: str, *, because: EpisodeCloseReason = EpisodeCloseReason.TRUNCATED) -> None:
        nonlocal status, failure_reason, close_reason
        status, failure_reason, close_reason = "truncated", reason, because

    def budget() -> str:
        return (f"{len(episode)} tokens in the conversation + max_new_tokens={limits.max_new_tokens}"
                f"{' + 1 closing token' if layout.turn_overhead else ''} > max_seq_len={limits.max_seq_len}")

    def overflow() -> str:
        # The reply was not appended (it is cut out, never in part): the conversation is as before it.
        return (f"{len(episode)} tokens in the conversation before it, and it would take the conversation "
                f"past max_seq_len={limits.max_seq_len}")

    try:
        if circuit_open_reason is not None:
            raise EpisodeFailure(circuit_open_reason)
        if isinstance(environment, AgentProgramEnvironment):
            began = time.perf_counter()
            played = await agent_program_episode(environment, task, policy=policy, layout=layout,
                                                  tokenizer=tokenizer, limits=limits, model=f"tandem-run-{run_id}")
            episode, agent_calls, reward = played.tokens, played.calls, played.reward
            policy_versions, newest_version = played.policy_versions, played.newest_policy_version
            generation_s = played.generation_s
            environment_s = time.perf_counter() - began - generation_s
            if played.truncated_because is not None:
                truncated(played.truncated_because)
            else:
                close_reason = EpisodeCloseReason.DONE
        else:
            began = time.perf_counter()
            prompt = await _call_environment(
                environment.reset(task), what="reset", timeout_s=limits.environment_timeout_s,
                check=lambda value: checked_observation(value, "reset", max_chars=limits.max_observation_chars),
            )
            environment_s += time.perf_counter() - began
            try:
                episode = layout.start(prompt, environment.tools)
            except (PromptFormatError, ChatTemplateError) as exc:
                raise EpisodeFailure(f"the prompt cannot be rendered: {exc}") from exc
            if _room_left(episode, limits, layout) < 0:
                raise EpisodeFailure(
                    f"the prompt alone leaves no room for a turn: {budget()}; raise model.max_seq_len "
                    "or lower sampling.max_new_tokens"
                )
            for turn in range(limits.max_turns):
                if _room_left(episode, limits, layout) < 0:
                    truncated(f"no room for turn {turn + 1}: {budget()}")
                    break
                began = time.perf_counter()
                try:
                    completion = await policy.generate(episode.context(), session_id=trajectory_id)
                except Exception as exc:  # noqa: BLE001 - recorded on the episode
                    raise EpisodeFailure(f"generation failed: {type(exc).__name__}: {exc}") from exc
                generation_s += time.perf_counter() - began
                # The version of the turn's first token: the oldest one if weights changed mid-turn.
                policy_versions.append(completion.policy_version)
                # Weights may also change between the turn's decode chunks; versions only grow, so the
                # last token's is the newest.
                newest_version = completion.last_policy_version
                # A turn cut off at max_new_tokens still acts: the environment judges
                # whatever was said, so a policy that never stops gets no free pass.
                text = tokenizer.decode(completion.token_ids)
                parsed = parse_tool_calls(text, environment.tools, formats=parse_formats)
                calls = parsed.calls
                layout.add_sampled(
                    episode, completion.token_ids, completion.logprobs, content=text,
                    tool_calls=[call.recorded() for call in calls],
                )
                episode.note_tool_call_outcome(parsed.status, parsed.error)
                if parsed.error is not None:
                    # An attempt at a call that is none: the model is told why, in its tool role, and the
                    # episode goes on. Passed to `step` instead, it would be judged as the final answer.
                    if not _append(episode, layout, [{"role": "tool", "content": f"error: {parsed.error}"}], limits):
                        truncated(f"the tool-call error after turn {turn + 1} does not fit: {overflow()}")
                        break
                    continue
                began = time.perf_counter()
                if calls:
                    # Several calls in one turn (Hermes style) run in order; each result is a tool message.
                    results, refusals = [], []
                    for call in calls:
                        observe = functools.partial(checked_observation, where=f"tool {call.tool.name}",
                                                    max_chars=limits.max_observation_chars)
                        try:
                            # Tools may answer with any value; its text is the observation.
                            content = await _call_environment(
                                call.tool.run(call.arguments), what=f"tool {call.tool.name}",
                                timeout_s=limits.environment_timeout_s, check=lambda value, see=observe: see(str(value)))
                        except ToolError as exc:
                            refusals.append(f"{call.tool.name}: {exc}")
                            content = _call_environment_check(observe, f"error: {exc}")
                        results.append({"role": "tool", "content": content})
                    if refusals:
                        episode.note_tool_call_outcome("tool_error", "; ".join(refusals))
                    tool_s += time.perf_counter() - began
                    if not _append(episode, layout, results, limits):
                        truncated(f"the tool results after turn {turn + 1} do not fit: {overflow()}")
                        break
                    continue
                result = await _call_environment(
                    environment.step(text), what="step", timeout_s=limits.environment_timeout_s,
                    check=lambda value: checked_step_result(value, max_observation_chars=limits.max_observation_chars),
                )
                environment_s += time.perf_counter() - began
                reward += float(result.reward)
                if result.done:
                    close_reason = EpisodeCloseReason.DONE
                    break
                if not _append(episode, layout, [{"role": "user", "content": result.observation}], limits):
                    truncated(f"the environment's observation after turn {turn + 1} does not fit: {overflow()}")
                    break
            else:
                truncated(f"reached max_turns={limits.max_turns} before the environment ended the episode",
                          because=EpisodeCloseReason.MAX_TURNS)
        environment_verdict = True
    except EnvironmentFault as exc:
        status, failure_reason, reward = "failed", str(exc), 0.0
        close_reason = EpisodeCloseReason.FAILED
        environment_verdict = False
    except EpisodeFailure as exc:
        status, failure_reason, reward = "failed", str(exc), 0.0
        close_reason = EpisodeCloseReason.FAILED
    except asyncio.CancelledError:
        # The task was cancelled or ran past its time limit: the environment is still told.
        close_reason = EpisodeCloseReason.CANCELLED
        raise
    finally:
        if redact is not None:
            failure_reason = redact(failure_reason)
        policy.end_session(trajectory_id)
        if circuit_open_reason is None:
            if environment_verdict is True:
                breakers.record_success(environment_name)
            elif environment_verdict is False:
                breakers.record_failure(environment_name, failure_reason)
            else:
                breakers.release_probe(environment_name)
            await _close_environment(environment, close_reason, environment_name=environment_name,
                                     timeout_s=limits.environment_timeout_s, redact=redact)

    loss_mask = [0] * len(episode) if status == "failed" else episode.loss_mask
    return TrajectoryRecord(
        trajectory_id=trajectory_id,
        run_id=run_id,
        group_id=group_id,
        group_size=group_size,
        environment=environment_name,
        producer=WORKER_NAME,
        policy_version=min(policy_versions) if policy_versions else 0,
        policy_versions=policy_versions,
        newest_policy_version=newest_version,
        token_ids=episode.token_ids,
        behaviour_logprobs=episode.behaviour_logprobs,
        loss_mask=loss_mask,
        reward=reward,
        status=status,
        failure_reason=failure_reason,
        num_turns=len(policy_versions),
        timings=EpisodeTimings(
            started_at=started_at,
            finished_at=time.time(),
            generation_s=generation_s,
            environment_s=environment_s,
            tool_s=tool_s,
        ),
        messages=tuple(ConversationMessage(**message) for message in episode.messages),
        segment_starts=tuple(episode.segment_starts),
        offered_tools=tuple(tool.name for tool in episode.tools),
        agent_calls=agent_calls,
    )


async def agent_program_episode(environment: AgentProgramEnvironment, task: dict[str, Any], *,
                                policy: SamplingPolicy, layout: PromptLayout, tokenizer: Tokenizer,
                                limits: EpisodeLimits, model: str) -> AgentEpisodeResult:
    """Run the environment's agent program on ``task`` against an endpoint of its own (workers/agent_endpoint.py).

    Raises EnvironmentFault when the agent failed, never called its endpoint, or reported no reward;
    the endpoint's key is refused once this returns or raises.
    """
    server = await agent_endpoint_server()
    agent_episode = AgentEpisode(policy=policy, layout=layout, tokenizer=tokenizer, max_seq_len=limits.max_seq_len,
                                 max_calls=limits.max_turns, model=model)
    access = server.open(agent_episode)
    failure = None
    try:
        answered = await environment.run_agent(task, access)
    except AgentProgramError as exc:
        failure = str(exc)
    finally:
        played = server.close_episode(agent_episode)
    if played.endpoint_failure is not None:
        # Whatever the agent made of it, the episode failed on Tandem's side: not the agent's fault.
        raise EpisodeFailure(f"the endpoint failed: {played.endpoint_failure}")
    if failure is not None:
        raise EnvironmentFault(failure)
    if not played.calls:
        raise EnvironmentFault(f"the {environment.label} ended without calling its endpoint")
    reward = answered if answered is not None else played.reward
    if reward is None:
        raise EnvironmentFault(f"the {environment.label} reported no reward (POST <base_url>/reward, or the "
                               "service's answer)")
    played.reward = reward
    return played


def _append(episode: EpisodeTokens, layout: PromptLayout, messages: list[dict], limits: EpisodeLimits) -> bool:
    """Append the environment's messages if they fit within max_seq_len; False (nothing appended) if not."""
    try:
        return layout.add_messages(episode, messages, max_tokens=limits.max_seq_len)
    except (PromptFormatError, ChatTemplateError) as exc:
        raise EpisodeFailure(f"the environment's reply cannot be rendered: {exc}") from exc
