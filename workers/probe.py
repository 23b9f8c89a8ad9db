"""The conformance probe: can producers use this environment version?

The probe does what a producer does for one episode, with a harmless action,
and checks every answer's shape: the URL (for remote kinds), loading the class
with the registered settings and secret settings, sampling a task, ``reset``,
the declared tools, one ``step`` with :data:`~tandem.contracts.PROBE_ACTION`,
whether the reset plus one turn fits a run's default conversation budget
(``budget``, a warning only), a few ``demonstrations`` (a remote environment's
are fetched; none is fine, malformed ones fail), and ``close``, which tells the
environment its episode ended (``EpisodeCloseReason.PROBE``; a remote server's
``/close``) and releases it. A request with a ``baseline`` then plays a few held-out
episodes of the imported model it names (workers/probe_baseline.py) and reports its
tool-call rate; a model that never calls the tools is a warning, not a failure. Each check has its own timeout and
its wall time is reported; its message never holds a secret setting's value.
The first failing check ends the probe; the checks after it are reported as skipped.

Timeouts hold against environments that block the event loop too (a
``time.sleep`` in ``reset``): the environment runs on an event loop in a
thread of its own and the probe waits on each call from outside it. A thread
stuck in such a call is abandoned (it is a daemon) and named in the report.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import redis

from environments import (
    AgentProgramEnvironment,
    Environment,
    MalformedOutputError,
    ToolError,
    checked_demonstrations,
    checked_json,
    checked_observation,
    checked_step_result,
    demonstration_messages,
    load_environment_class,
)
from policy import ByteLayout, ByteTokenizer, Completion
from tandem.allowlists.environment_urls import (
    EnvironmentURLRefused,
    check_environment_url,
    resolve_host,
)
from tandem.configs.run import RunConfig
from tandem.contracts import (
    PROBE_ACTION,
    TOOL_CALL_RATE_FIGURE,
    DemonstrationMessage,
    EpisodeCloseReason,
    ProbeBaseline,
    ProbeCheck,
    ProbeReport,
    ProbeRequest,
    ProbeToolCall,
    ToolSchema,
    episode_limit,
    probe_environment_secrets_key,
    probe_request_key,
)
from tandem.runtime.secrets_at_rest import SecretsCipher, SecretsKeyError, environment_secrets_open
from workers.agent import EpisodeFailure, EpisodeLimits, agent_program_episode
from workers.episode_slots import advertised_max_concurrent_episodes
from workers.probe_baseline import run_baseline
from workers.secret_settings import SecretSettings

# Enough of a message to act on, not a whole HTML error page.
_MESSAGE_CHARS = 500
_PROBE_SEED = 0
# Demonstrations the probe asks for: enough to see their shape.
_PROBE_DEMONSTRATIONS = 2
# Closing an environment whose reset failed, while the probe winds down: bounded, never reported.
_RELEASE_TIMEOUT_S = 5.0


class CheckFailed(Exception):
    """A check's verdict, with the message shown to whoever registered the environment."""


class CheckWarning(Exception):
    """A check that passed with something to say: the environment works, but not well as configured."""


def check_budget(environment: Environment, observation: str, step_observation: str) -> str:
    """Whether a reset, one turn and the step's answer fit the conversation budget of a default run.

    Counted in the default config's layout (the byte tokenizer, a token per
    byte, with the tool header); a model with a larger vocabulary needs fewer.
    """
    defaults = RunConfig()
    max_seq_len, max_new_tokens = defaults.model.max_seq_len, defaults.sampling.max_new_tokens
    prompt = len(ByteLayout(ByteTokenizer()).start(observation, getattr(environment, "tools", ()) or ()))
    answer = len(step_observation.encode("utf-8"))
    needed = prompt + max_new_tokens + answer
    if needed > max_seq_len:
        raise CheckWarning(
            f"a reset ({prompt} tokens with the tool header), one turn (sampling.max_new_tokens="
            f"{max_new_tokens}) and the step's observation ({answer} tokens) need {needed} tokens, more "
            f"than a default run's model.max_seq_len={max_seq_len}: its episodes would be truncated; "
            f"set model.max_seq_len to {needed} or more in runs of this environment"
        )
    return f"reset and one turn need {needed} of the default {max_seq_len} tokens"


class _ProbeReplies:
    """The probe's policy for an agent program: it has no model, so every answer is PROBE_ACTION."""

    def __init__(self):
        self.tokenizer = ByteTokenizer()
        self.sampling = RunConfig().sampling

    async def generate(self, prompt: list[int], *, session_id: Any = None, extra_stop: Any = ()) -> Completion:
        tokens = [*self.tokenizer.encode(PROBE_ACTION), self.tokenizer.eos_id]
        return Completion(token_ids=tokens, logprobs=[0.0] * len(tokens), finished=True, stop_reason="eos")

    def end_session(self, session_id: Any) -> None:
        return None


async def probe_agent_program(environment: AgentProgramEnvironment, task: dict[str, Any], *,
                              declared: tuple[ToolSchema, ...] = ()) -> str:
    """One episode of the agent against an endpoint that answers PROBE_ACTION: whether it called the
    endpoint, how many calls it made, whether their prefixes held, and the reward it reported. Tools the
    registration declares must be those the agent offered (SFT renders a dataset's conversations with
    them, so they must be what the agent's calls show the model)."""
    if not isinstance(environment, AgentProgramEnvironment):
        raise CheckFailed(f"kind 'agent' loaded a {type(environment).__name__}")
    defaults = RunConfig()
    replies = _ProbeReplies()
    try:
        played = await agent_program_episode(
            environment, task, policy=replies, layout=ByteLayout(replies.tokenizer), tokenizer=replies.tokenizer,
            limits=EpisodeLimits.of_run(defaults), model="tandem-probe")
    except EpisodeFailure as exc:
        raise CheckFailed(str(exc)) from None
    offered = {tool.name: tool.parameters for tool in played.tokens.tools}
    if declared and offered != {tool.name: tool.parameters for tool in declared}:
        raise CheckFailed(f"the agent offered the tools {json.dumps(offered, sort_keys=True)}, not the declared "
                          f"{', '.join(sorted(tool.name for tool in declared))}; declare what it offers")
    calls = len(played.calls)
    chains = ("its prefixes held (one chain)" if not played.history_rewrites else
              f"it rewrote its history {played.history_rewrites} time(s) ({played.history_rewrites + 1} chains)")
    return f"the agent called its endpoint {calls} time(s); {chains}; it reported a reward of {played.reward:g}"


def _short(text: str) -> str:
    return text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS] + " ..."


def _describe(exc: BaseException) -> str:
    # An environment's output outside the interface is a verdict that already says where.
    if isinstance(exc, CheckFailed | MalformedOutputError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class _EnvironmentLoop:
    """An event loop on a daemon thread; the probe waits on it with timeouts from outside."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="probe-environment", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine, timeout_s: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise CheckFailed(f"timed out after {timeout_s:g}s") from None

    def call(self, function: Callable[[], Any], timeout_s: float) -> Any:
        async def call_on_loop():
            return function()

        return self.run(call_on_loop(), timeout_s)

    def stop(self, join_timeout_s: float = 2.0, *,
             release: Callable[[], Coroutine] | None = None) -> bool:
        """Stop the loop; False if its thread is still stuck in an environment call.

        Calls that timed out were cancelled from outside; they finish
        cancelling (closing their connections) before the loop stops, as
        under ``asyncio.run``, not later against a closed loop. A loop stuck
        in a blocking call winds down whenever the call returns. ``release``
        (an environment's ``close``) runs last, untimed by any check, its
        failure ignored.
        """
        def wind_down() -> None:
            task = self.loop.create_task(_cancel_other_tasks(release))
            task.add_done_callback(lambda _: self.loop.stop())

        self.loop.call_soon_threadsafe(wind_down)
        self.thread.join(join_timeout_s)
        if self.thread.is_alive():
            return False
        self.loop.close()
        return True


async def _cancel_other_tasks(release: Callable[[], Coroutine] | None) -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if release is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(release(), _RELEASE_TIMEOUT_S)
    await asyncio.get_running_loop().shutdown_asyncgens()


async def check_demonstrations(environment: Environment) -> str:
    """A few of the environment's demonstrations (awaited when its ``demonstrations`` is async)
    are well formed and become chat messages, as an SFT step's would (workers/demonstrations.py)."""
    demonstrations = environment.demonstrations(_PROBE_DEMONSTRATIONS, random.Random(_PROBE_SEED))
    if inspect.isawaitable(demonstrations):
        demonstrations = await demonstrations
    demonstrations = checked_demonstrations(demonstrations)
    if len(demonstrations) > _PROBE_DEMONSTRATIONS:
        raise CheckFailed(f"asked for {_PROBE_DEMONSTRATIONS} demonstrations, got {len(demonstrations)}")
    if not demonstrations:
        return "none: runs of this environment skip the SFT warm-up"
    for demonstration in demonstrations:
        for message in demonstration_messages(demonstration, getattr(environment, "tools", ()) or (), "tandem"):
            DemonstrationMessage.model_validate(message)
    turns = sum(len(demonstration.turns) for demonstration in demonstrations)
    return f"{len(demonstrations)} demonstrations of {turns} turns"


async def close_probe_episode(environment: Environment) -> str:
    """``close_episode(PROBE)``, then ``close`` even if that failed; a failed close_episode is a warning."""
    try:
        await environment.close_episode(EpisodeCloseReason.PROBE)
    except Exception as exc:  # noqa: BLE001 - reported, as an episode's would be logged
        await environment.close()
        raise CheckWarning(f"close_episode raised {_describe(exc)}; episodes are not failed for it") from None
    await environment.close()
    return "closed"


def check_step_result(result: Any) -> str:
    checked_step_result(result)
    return f"reward {float(result.reward):g}, done {result.done}"


def check_tools(environment: Environment, declared: tuple[ToolSchema, ...]) -> str:
    """The environment exposes exactly the declared tools, with the declared argument schemas."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    exposed = {}
    for tool in getattr(environment, "tools", ()) or ():
        exposed[tool.name] = {"description": tool.description, "parameters": tool.parameters}
    wanted = {tool.name: tool for tool in declared}
    problems = []
    missing = sorted(set(wanted) - set(exposed))
    if missing:
        problems.append(f"declared but not exposed: {', '.join(missing)}")
    undeclared = sorted(set(exposed) - set(wanted))
    if undeclared:
        schemas = json.dumps([{"name": name, **exposed[name]} for name in undeclared], sort_keys=True)
        problems.append(f"exposed but not declared (register them): {schemas}")
    for name in sorted(set(wanted) & set(exposed)):
        parameters = exposed[name]["parameters"]
        if parameters != wanted[name].parameters:
            problems.append(f"{name}: parameters differ from the declaration; exposed "
                            f"{json.dumps(parameters, sort_keys=True)}")
            continue
        try:
            Draft202012Validator.check_schema(parameters)
        except SchemaError as exc:
            problems.append(f"{name}: parameters is not a valid JSON schema: {exc.message}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{len(exposed)} tool{'s' if len(exposed) != 1 else ''}: {', '.join(sorted(exposed)) or 'none'}"


async def check_tool_calls(environment: Environment, calls: tuple[ProbeToolCall, ...]) -> str:
    """Each call the registration asked for (``tool_server.probe_calls``) answers without an error."""
    tools = {tool.name: tool for tool in getattr(environment, "tools", ()) or ()}
    answers = []
    for call in calls:
        tool = tools.get(call.name)
        if tool is None:
            raise CheckFailed(f"{call.name}: the environment exposes no such tool")
        try:
            answer = await tool.run(dict(call.arguments))
        except ToolError as exc:
            raise CheckFailed(f"{call.name}({_short(json.dumps(call.arguments))}) answered an error: {exc}") from None
        answers.append(f"{call.name} answered {_short(str(answer).strip())!r}")
    return "; ".join(answers)


def run_probe(request: ProbeRequest, *, secrets: SecretSettings | None = None) -> ProbeReport:
    """Run every check of ``request`` and report; never raises for the environment's faults.

    ``secrets``: the version's secret settings, merged into its settings when it is built
    and replaced by their names in every check's message.
    """
    spec = request.environment
    timeouts = request.timeouts
    secrets = secrets or SecretSettings()
    started_at = time.time()
    checks: list[ProbeCheck] = []
    state: dict[str, Any] = {}
    loop = _EnvironmentLoop()

    def check_url() -> str:
        url = spec.settings.get("url")
        if not isinstance(url, str):
            return "no remote URL"
        try:
            check_environment_url(url, allowlist=request.url_allowlist, resolve=resolve_host)
        except EnvironmentURLRefused as exc:
            raise CheckFailed(str(exc)) from None
        return f"{url} is allowed"

    def load() -> str:
        environment_class = load_environment_class(spec)
        state["class"] = environment_class
        state["environment"] = environment_class(**secrets.constructor_kwargs(spec.settings))
        return spec.entrypoint

    def sample_task() -> str:
        task = state["environment"].sample_task(random.Random(_PROBE_SEED))
        if not isinstance(task, dict):
            raise CheckFailed(f"sample_task returned a {type(task).__name__}, expected dict")
        checked_json(task, "the task")
        state["task"] = task
        return _short(json.dumps(task, sort_keys=True))

    async def reset() -> str:
        state["reset_attempted"] = True
        observation = checked_observation(await state["environment"].reset(state["task"]), "reset")
        state["reset"] = True
        state["observation"] = observation
        return f"observation of {len(observation)} chars"

    async def step() -> str:
        result = await state["environment"].step(PROBE_ACTION)
        verdict = check_step_result(result)
        state["step_observation"] = result.observation
        return verdict

    async def demonstrations() -> str:
        return await check_demonstrations(state["environment"])

    async def close() -> str:
        return await close_probe_episode(state["environment"])

    async def tool_calls() -> str:
        return await check_tool_calls(state["environment"], spec.tool_server.probe_calls)

    async def agent() -> str:
        return await probe_agent_program(state["environment"], state["task"], declared=spec.tools)

    if spec.kind == "agent":
        # The agent runs the episode, bounded by its own timeout_s (the registration's setting).
        agent_timeout_s = float(spec.settings.get("timeout_s") or 300.0) + timeouts.step
        plan: list[tuple[str, Callable[[], Any], float]] = [
            ("url", check_url, timeouts.url),
            ("load", load, timeouts.load),
            ("sample_task", sample_task, timeouts.load),
            ("agent", agent, agent_timeout_s),
        ]
    else:
        plan = [
            ("url", check_url, timeouts.url),
            ("load", load, timeouts.load),
            ("sample_task", sample_task, timeouts.load),
            ("reset", reset, timeouts.reset),
            ("tools", lambda: check_tools(state["environment"], spec.tools), timeouts.tools),
            *([("tool_calls", tool_calls, timeouts.step)] if spec.tool_server and spec.tool_server.probe_calls
              else []),
            ("step", step, timeouts.step),
            ("budget", lambda: check_budget(state["environment"], state["observation"], state["step_observation"]),
             timeouts.tools),
            ("demonstrations", demonstrations, timeouts.demonstrations),
        ]
    failed = False
    for name, function, timeout_s in plan:
        if failed:
            checks.append(ProbeCheck(name=name, status="skipped", message="an earlier check failed",
                                     timeout_s=timeout_s))
            continue
        checks.append(_timed(name, function, timeout_s, loop, secrets.redact))
        failed = checks[-1].status == "failed"
    # What the environment says it can serve (workers/episode_slots.py): read quietly, never a verdict.
    capacity = None
    if not failed:
        with contextlib.suppress(Exception):
            capacity = loop.run(advertised_max_concurrent_episodes(state["environment"], kind=spec.kind),
                                timeouts.tools)
    if spec.kind == "agent":
        pass  # its episode opened and closed its own endpoint: nothing of it is left to close
    elif "environment" in state and state.get("reset"):
        # close() runs even after a failed step: it releases what reset took.
        checks.append(_timed("close", close, timeouts.close, loop, secrets.redact))
    else:
        checks.append(ProbeCheck(name="close", status="skipped", message="nothing to close",
                                 timeout_s=timeouts.close))
    if request.baseline is not None:
        # After close: the probe's own episode no longer holds a slot of the environment's.
        if failed:
            checks.append(ProbeCheck(name="baseline", status="skipped", message="an earlier check failed",
                                     timeout_s=timeouts.baseline))
        elif spec.kind == "agent":
            checks.append(ProbeCheck(name="baseline", status="skipped", timeout_s=timeouts.baseline,
                                     message="an agent program plays its episodes with its own agent: "
                                     "evaluate the model in an evaluation-only run"))
        else:
            async def baseline() -> str:
                # A thread of its own: the episodes run on an event loop of their own, beside this one.
                state["baseline"] = await asyncio.to_thread(
                    run_baseline, request.baseline, environment_name=spec.name,
                    make_environment=lambda: state["class"](**secrets.constructor_kwargs(spec.settings)),
                    concurrency=episode_limit(spec.max_concurrent_episodes, capacity), redact=secrets.redact)
                return baseline_verdict(state["baseline"])

            check = _timed("baseline", baseline, timeouts.baseline, loop, secrets.redact)
            if check.status == "failed":
                # The model would not load, or its episodes ran out of time: the environment's checks
                # passed, so it is registered all the same, with the reason in words.
                check = check.model_copy(update={"status": "warning",
                                                 "message": f"the baseline did not finish: {check.message}"})
            checks.append(check)
    # A reset that failed (a hang that timed out, say) may hold connections all the same.
    reset_failed = "environment" in state and state.get("reset_attempted") and not state.get("reset")
    release = (lambda: close_probe_episode(state["environment"])) if reset_failed else None
    if not loop.stop(release=release):
        last = checks[-1]
        checks[-1] = last.model_copy(update={
            "message": f"{last.message}; the environment's thread is still blocked and was abandoned"})
    return ProbeReport(probe_id=request.probe_id, checks=tuple(checks),
                       worker=f"{socket.gethostname()}:{os.getpid()}",
                       started_at=started_at, finished_at=time.time(), max_concurrent_episodes=capacity,
                       baseline=state.get("baseline"))


def baseline_verdict(baseline: ProbeBaseline) -> str:
    """The ``baseline`` check's message; a warning when the environment offers tools and the model
    called none in any episode (GRPO alone would then see no reward for calling them)."""
    statuses = ", ".join(f"{count} {status}" for status, count in sorted(baseline.statuses.items()))
    summary = f"{baseline.model}: {baseline.episodes} held-out episodes ({statuses}), mean reward {baseline.mean_reward:.3g}"
    rate = baseline.tool_call_rate
    if rate is None:
        return f"{summary}; the environment offered no tools"
    low, high = baseline.tool_use_ci95.get(TOOL_CALL_RATE_FIGURE, (rate, rate))
    calls = baseline.tool_use.get("tool_calls_per_episode", 0.0)
    summary += f", tool-call rate {rate:.3g} (95% {low:.2g} to {high:.2g}), {calls:.3g} calls per episode"
    if (parse_failures := baseline.tool_use.get("tool_parse_failure_rate")) is not None:
        summary += f", {parse_failures:.3g} of the turns that wrote call markup did not parse"
    if rate == 0:
        raise CheckWarning(f"{summary}. The model never called a tool: GRPO alone has no signal from it; "
                           "start with SFT on tool-using demonstrations, or add algorithm.tool_call_bonus "
                           "(docs/tool_use.md)")
    return summary


def _timed(name: str, function: Callable[[], Any], timeout_s: float,
           loop: _EnvironmentLoop, redact: Callable[[str], str]) -> ProbeCheck:
    started = time.perf_counter()
    try:
        if inspect.iscoroutinefunction(function):
            message = loop.run(function(), timeout_s)
        else:
            message = loop.call(function, timeout_s)
        status = "passed"
    except CheckWarning as exc:
        message, status = str(exc), "warning"
    except Exception as exc:  # noqa: BLE001 - any fault of the environment is the check's verdict
        message, status = _describe(exc), "failed"
    # Redacted before it is cut short, which could leave part of a value. The report is
    # shown to the project's viewers, and an environment's error may quote its key.
    return ProbeCheck(name=name, status=status, message=_short(redact(str(message))),
                      latency_s=round(time.perf_counter() - started, 6), timeout_s=timeout_s)


def probe_by_id(*, redis_url: str, probe_id: int) -> ProbeReport:
    """Run the probe the platform asked for under ``probe_id``, with the version's secret settings."""
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.get(probe_request_key(probe_id))
        raw_secrets = client.get(probe_environment_secrets_key(probe_id))
    finally:
        client.close()
    if raw is None:
        return _request_failed(probe_id, "the probe request expired in Redis before a worker took it; probe again")
    request = ProbeRequest.model_validate_json(raw)
    try:
        secrets = None if raw_secrets is None else environment_secrets_open(raw_secrets,
                                                                           SecretsCipher.from_environment())
    except SecretsKeyError as exc:
        return _request_failed(probe_id, f"this worker cannot decrypt the secret settings: {exc}")
    names = set(request.environment.secret_setting_names)
    if names and (secrets is None or set(secrets.settings) != names):
        return _request_failed(probe_id, f"the secret settings ({', '.join(sorted(names))}) are not in Redis: "
                                         "they expired before a worker took the probe; probe again")
    return run_probe(request, secrets=SecretSettings(secrets.revealed() if secrets else None))


def _request_failed(probe_id: int, message: str) -> ProbeReport:
    now = time.time()
    check = ProbeCheck(name="request", status="failed", message=message)
    return ProbeReport(probe_id=probe_id, checks=(check,), worker=f"{socket.gethostname()}:{os.getpid()}",
                       started_at=now, finished_at=now)
