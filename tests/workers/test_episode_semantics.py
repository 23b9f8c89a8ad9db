"""Episode semantics as docs/environments.md ("Episode semantics") states them, one test per statement.

Episodes run through the real agent loop and a real inference engine (a nano
policy, weights published to the real Redis). Two engines serve them: one with
drawn weights, whose text is noise (it never writes a tool call), and one whose
weights make it a bigram table: attention and MLP write nothing, so the logits
at a position depend on its token alone, and each token of :data:`BIGRAMS`
is followed by its successor with a logit margin of about 170 (deterministic
at temperature 1). The token that opens a turn is the last of the prompt or
observation, so an environment picks what the policy says by how its text ends.
The statements about ``<tool_call>`` markup, which no bigram table can write
(it repeats letters with different successors), and about the built-ins'
rewards, which need a game played right, script their turns at the policy's
boundary (:class:`ScriptedTurns`); the agent loop, the parser and the
environments are the real ones there too. Each test's docstring quotes the
sentence of the doc it checks.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
import pytest
import redis
from flax import nnx

from environments.adapters.gymnasium_text import GymnasiumTextEnvironment
from environments.base import Environment, StepResult, Tool
from environments.builtin.calculator import CalculatorEnvironment
from environments.builtin.guessing_game import GuessingGameEnvironment
from policy import Completion
from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import EOS_ID, VOCAB_SIZE
from policy.weights import RedisWeightPublisher
from tandem.configs.algorithm import AlgorithmConfig
from tandem.configs.rollout import RolloutConfig, SamplingConfig
from tandem.configs.run import ModelConfig, RunConfig
from tandem.contracts import TrajectoryRecord
from trainer.algorithms import build_algorithm
from workers.agent import EpisodeLimits, run_episode
from workers.circuit_breaker import CircuitBreakers
from workers.policy import BatchingPolicy, PolicyRuntime

MAX_NEW_TOKENS = 8
CONFIG = RunConfig(
    model=ModelConfig(d_model=32, num_layers=1, num_heads=2, mlp_dim=64, max_seq_len=256),
    rollout=RolloutConfig(group_size=2, max_turns=3),
    sampling=SamplingConfig(max_new_tokens=MAX_NEW_TOKENS),
)
#: What the bigram policy says after a turn-opening token (its EOS included).
BIGRAMS = {
    ">": "go(1)",      # a call to the tool ``go`` in the tandem format
    "?": "xy(1)",      # the same shape, naming no declared tool
    "!": "a",          # a two-token turn: "a", EOS
    "~": "zzzzzzzzz",  # never ends: cut off at max_new_tokens
}


def _bigram_params(config: TransformerConfig):
    model = Transformer(config, rngs=nnx.Rngs(0))
    successors: dict[int, int] = {}
    for opener, turn in BIGRAMS.items():
        tokens = [ord(opener), *turn.encode()]
        successors |= dict(zip(tokens, tokens[1:], strict=False))
        if turn != "zzzzzzzzz":
            successors[tokens[-1]] = EOS_ID
    successors[ord("z")] = ord("z")
    embedding = np.zeros((config.vocab_size, config.d_model), np.float32)
    head = np.zeros((config.d_model, config.vocab_size), np.float32)
    for dimension, (token, successor) in enumerate(successors.items()):
        embedding[token, dimension] = 1.0
        head[dimension, successor] = 30.0

    def assign(param, value):
        param[...] = jnp.asarray(value, dtype=param[...].dtype)

    assign(model.embedding.embedding, embedding)
    assign(model.head.kernel, head)
    for block in model.blocks:
        assign(block.attention.output.kernel, np.zeros(block.attention.output.kernel[...].shape))
        assign(block.mlp.down.kernel, np.zeros(block.mlp.down.kernel[...].shape))
    return split_model(model)[1]


def _runtime(redis_url: str, params_of: Callable[[TransformerConfig], object]) -> PolicyRuntime:
    client = redis.Redis.from_url(redis_url)
    run_id = random.randint(10**8, 10**9)
    params = params_of(TransformerConfig.from_model_config(CONFIG.model, VOCAB_SIZE))
    RedisWeightPublisher(client).publish(run_id=run_id, version=1, params=params)
    runtime = PolicyRuntime(run_id=run_id, config=CONFIG, redis_client=client)
    runtime.refresh_weights(force=True)
    return runtime


@pytest.fixture(scope="module")
def drawn(redis_url):
    """An engine with drawn weights: noise, never a tool call."""
    runtime = _runtime(redis_url, lambda config: split_model(Transformer(config, rngs=nnx.Rngs(0)))[1])
    yield runtime
    runtime.close()


@pytest.fixture(scope="module")
def bigram(redis_url):
    """An engine that says BIGRAMS[c] after a prompt or observation ending in c."""
    runtime = _runtime(redis_url, _bigram_params)
    yield runtime
    runtime.close()


def _limits(*, max_turns=3, max_seq_len=256, environment_timeout_s=5.0, max_observation_chars=8192):
    return EpisodeLimits(max_turns=max_turns, max_seq_len=max_seq_len, max_new_tokens=MAX_NEW_TOKENS,
                         environment_timeout_s=environment_timeout_s, max_observation_chars=max_observation_chars)


def _episodes(runtime: PolicyRuntime, environments: list[Environment], limits: EpisodeLimits,
              policy=None, task=None) -> list[TrajectoryRecord]:
    async def episodes():
        batching = policy or BatchingPolicy(runtime, seed=0)
        try:
            return await asyncio.gather(*[
                run_episode(run_id=runtime.run_id, group_id=f"{runtime.run_id}-0", group_size=len(environments),
                            environment_name="semantics", environment=environment, task=task or {}, policy=batching,
                            limits=limits, tokenizer=runtime.tokenizer, layout=runtime.prompt_layout,
                            circuit_breakers=CircuitBreakers())
                for environment in environments])
        finally:
            if policy is None:
                await batching.close()

    return asyncio.run(episodes())


def _episode(runtime, environment, limits, policy=None, task=None) -> TrajectoryRecord:
    return _episodes(runtime, [environment], limits, policy, task)[0]


def _scripted_episode(environment, turns, limits, task=None) -> TrajectoryRecord:
    """An episode whose turns are ``turns``, said in place of the engine; the agent loop is the real one."""
    return asyncio.run(run_episode(
        run_id=1, group_id="1-0", group_size=1, environment_name="semantics", environment=environment,
        task=task or {}, policy=ScriptedTurns(turns), limits=limits, circuit_breakers=CircuitBreakers()))


AGAIN = StepResult("again\n", 0.25, False)


class Scripted(Environment):
    """Answers the n-th step with ``replies[n]`` (the last one again once they run out); records actions."""

    def __init__(self, *, prompt="say something\n", replies=(AGAIN,), tools=()):
        self.prompt, self.replies, self.tools = prompt, list(replies), tuple(tools)
        self.actions: list[str] = []

    def sample_task(self, rng):
        return {}

    async def reset(self, task):
        return self.prompt

    async def step(self, action):
        self.actions.append(action)
        reply = self.replies[min(len(self.actions), len(self.replies)) - 1]
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):
            return await reply()
        return reply


def _tool(run, name="go") -> Tool:
    return Tool(name=name, description="does it", run=run,
                parameters={"type": "object", "properties": {"what": {"type": "string"}}, "required": ["what"]})


class Counted:
    """A tool body that counts its calls and answers ``result``."""

    def __init__(self, result="ran>"):
        self.result, self.calls = result, []

    async def __call__(self, arguments):
        self.calls.append(arguments)
        return self.result


class ScriptedTurns:
    """Says the scripted turns in order (byte tokens, EOS-ended, log-probability 0) in place of the engine."""

    def __init__(self, turns):
        self.turns = list(turns)

    async def generate(self, token_ids, *, session_id):
        tokens = [*self.turns.pop(0).encode(), EOS_ID]
        return Completion(token_ids=tokens, logprobs=[0.0] * len(tokens), finished=True, stop_reason="eos",
                          policy_version=1, last_policy_version=1)

    def end_session(self, session_id):
        pass


def _text(record: TrajectoryRecord) -> bytes:
    return bytes(token for token in record.token_ids if token < 256)


# -- turns -------------------------------------------------------------------------------------------------


def test_a_turn_is_one_generation_and_max_turns_bounds_them(drawn):
    """"A turn is one generation of the policy, of at most `sampling.max_new_tokens` tokens;
    `rollout.max_turns` bounds the turns of an episode, and the record's `num_turns` counts them.\""""
    environment = Scripted()
    record = _episode(drawn, environment, _limits(max_turns=3))
    assert record.num_turns == 3 == len(record.policy_versions) == len(environment.actions)
    assistant = [message for message in record.messages if message.role == "assistant"]
    assert len(assistant) == 3
    assert all(0 < sum(record.loss_mask[m.start:m.end]) <= MAX_NEW_TOKENS for m in assistant)


def test_a_tool_call_turn_runs_the_tool_instead_of_step_and_counts_against_max_turns(bigram):
    """"A turn whose text is a call to a declared tool runs the tool instead of `step`, and counts
    against `max_turns` like any other turn.\""""
    go = Counted()
    environment = Scripted(prompt="call it>", tools=[_tool(go)])
    record = _episode(bigram, environment, _limits(max_turns=3))
    assert go.calls == [{"what": "1"}] * 3 and environment.actions == []
    assert record.num_turns == 3 and record.status == "truncated"
    assert record.failure_reason == "reached max_turns=3 before the environment ended the episode"
    assert [m.role for m in record.messages] == ["user"] + ["assistant", "tool"] * 3


def test_the_calls_of_one_turn_are_one_turn():
    """"The calls of one turn (several Hermes blocks) are one turn: they run in order, each result a
    tool message.\""""
    go = Counted(result="ran\n")
    environment = Scripted(prompt="call twice\n", tools=[_tool(go)], replies=[StepResult("", 1.0, True)])
    block = '<tool_call>{{"name": "go", "arguments": {{"what": "{}"}}}}</tool_call>'
    record = _scripted_episode(environment, [block.format("first") + block.format("second"), "answer"],
                               _limits(max_turns=2))
    assert record.status == "ok" and record.num_turns == 2
    assert go.calls == [{"what": "first"}, {"what": "second"}] and environment.actions == ["answer"]
    assert [m.role for m in record.messages] == ["user", "assistant", "tool", "tool", "assistant"]


def test_a_turn_cut_off_at_max_new_tokens_still_acts_and_is_not_marked(bigram):
    """"A turn cut off at `max_new_tokens` still acts: its text, as far as it got, is parsed and handed
    to `step` like a finished one, and nothing on the record marks the cut.\""""
    environment = Scripted(prompt="hum~", replies=[StepResult("", 1.0, True)])
    record = _episode(bigram, environment, _limits())
    assert environment.actions == ["z" * MAX_NEW_TOKENS]
    assert record.token_ids[-MAX_NEW_TOKENS:] == [ord("z")] * MAX_NEW_TOKENS  # no EOS: it was cut
    assert record.status == "ok" and record.failure_reason == "" and record.reward == 1.0


# -- actions and unparseable calls -------------------------------------------------------------------------


def test_text_that_is_no_call_of_a_declared_tool_is_the_action_verbatim(bigram):
    """"Anything the policy says that is not a well-formed call to a declared tool is an action: `step`
    gets the turn's text verbatim, special tokens such as EOS removed.\""""
    go = Counted()
    environment = Scripted(prompt="answer?", tools=[_tool(go)], replies=[StepResult("", 0.0, True)])
    record = _episode(bigram, environment, _limits())
    assert record.token_ids[-6:] == [*b"xy(1)", EOS_ID]  # the turn as sampled, EOS and all
    assert environment.actions == ["xy(1)"] and go.calls == []  # `xy` is no declared tool


@pytest.mark.parametrize("text", ["I would call go", "f(x)"])  # prose; an unknown tool, tandem style
def test_text_without_tool_call_markup_is_an_action(text):
    """"A turn without tool-call markup is an action [...] Prose and, in the byte layout's `tandem`
    format, `f(x)` of no declared tool are actions.\""""
    go = Counted(result="ran\n")
    environment = Scripted(prompt="call\n", tools=[_tool(go)], replies=[StepResult("", 0.0, True)])
    record = _scripted_episode(environment, [text], _limits())
    assert environment.actions == [text] and go.calls == [] and record.status == "ok"
    assert record.messages[-1].tool_call_status is None


@pytest.mark.parametrize(("text", "status", "reason"), [
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call>', "unknown_tool", "unknown tool 'f'; the tools are go"),
    ("<tool_call>{oops</tool_call>", "unparsed", "tool call is not valid JSON"),
    ('<tool_call>{"name": "go", "arguments": {"what": "1"}}', "unparsed", "<tool_call> without </tool_call>"),
    ('<tool_call>{"name": "go", "arguments": ["1"]}</tool_call>', "unparsed", "arguments of 'go' are not a JSON object"),
    ('<tool_call>{"name": "go", "arguments": {"how": "1"}}</tool_call>', "invalid_arguments",
     "'what' is a required property"),
    ('<tool_call>{"name": "go", "arguments": {"what": 1}}</tool_call>', "invalid_arguments",
     "at what: 1 is not of type 'string'"),
])
def test_markup_that_makes_no_call_is_answered_with_why_and_the_episode_goes_on(text, status, reason):
    """"Markup that makes no call is feedback, never an answer [...] a tool message in the model's format
    says what was wrong [...] and the episode goes on, the turn counting against `max_turns`.\""""
    go = Counted(result="ran\n")
    environment = Scripted(prompt="call\n", tools=[_tool(go)], replies=[StepResult("", 1.0, True)])
    record = _scripted_episode(environment, [text, "the answer"], _limits())
    assert go.calls == [] and environment.actions == ["the answer"]  # never taken as the answer
    assert record.status == "ok" and record.reward == 1.0 and record.num_turns == 2
    attempt, told, answer = record.messages[-3:]
    assert (attempt.role, attempt.tool_call_status, attempt.tool_calls) == ("assistant", status, ())
    assert reason in attempt.tool_call_error
    assert told.role == "tool" and told.content == f"error: {attempt.tool_call_error}"
    assert (answer.role, answer.content, answer.tool_call_status) == ("assistant", "the answer", None)
    assert f"error: {attempt.tool_call_error}".encode() in _text(record)  # the model saw it


def test_one_malformed_block_spoils_its_turn():
    """"One bad block spoils its whole turn: running only some of its calls would be a guess.\""""
    go = Counted(result="ran\n")
    environment = Scripted(prompt="call\n", tools=[_tool(go)], replies=[StepResult("", 0.0, True)])
    text = '<tool_call>{"name": "go", "arguments": {"what": "1"}}</tool_call><tool_call>{oops</tool_call>'
    record = _scripted_episode(environment, [text, "done"], _limits())
    assert go.calls == [] and environment.actions == ["done"]
    assert record.messages[-3].tool_call_status == "unparsed" and not record.messages[-3].tool_calls


def test_calls_that_ran_are_recorded_ok():
    go = Counted(result="ran\n")
    environment = Scripted(prompt="call\n", tools=[_tool(go)], replies=[StepResult("", 0.0, True)])
    record = _scripted_episode(environment, ['<tool_call>{"name": "go", "arguments": {"what": "1"}}</tool_call>',
                                             "done"], _limits())
    assert go.calls == [{"what": "1"}]
    assert [message.tool_call_status for message in record.messages if message.role == "assistant"] == ["ok", None]


# -- rewards -----------------------------------------------------------------------------------------------


def test_the_episode_reward_is_the_sum_of_every_steps_reward(drawn):
    """"The episode's reward is the sum of the rewards of all its `step` results, the last one included;
    no setting changes this.\""""
    environment = Scripted(replies=[StepResult("more\n", 0.25, False), StepResult("more\n", 0.5, False),
                                    StepResult("", 1.0, True)])
    record = _episode(drawn, environment, _limits(max_turns=5))
    assert record.status == "ok" and record.num_turns == 3
    assert record.reward == pytest.approx(1.75)
    settings = [*EpisodeLimits.__dataclass_fields__, *RolloutConfig.model_fields, *SamplingConfig.model_fields]
    assert not [name for name in settings if "reward" in name]


def test_tool_calls_earn_nothing(bigram):
    """"Tool calls earn nothing.\""""
    environment = Scripted(prompt="call it>", tools=[_tool(Counted())], replies=[StepResult("", 5.0, True)])
    record = _episode(bigram, environment, _limits(max_turns=2))
    assert record.num_turns == 2 and environment.actions == [] and record.reward == 0.0


def test_an_outcome_only_reward_is_zero_until_the_last_step_as_the_built_ins_pay():
    """"An environment that wants only the outcome to count returns 0 until its last step, as the
    built-in environments do.\""""
    rewards = []

    class Recorded(GuessingGameEnvironment):
        async def step(self, action):
            result = await super().step(action)
            rewards.append(result.reward)
            return result

    record = _scripted_episode(Recorded(), ["A:50", "A:25", "A:37"], _limits(), task={"target": 37})
    assert rewards == [0.0, 0.0, pytest.approx(0.81)] and record.reward == pytest.approx(0.81)

    rewards.clear()
    calculator = CalculatorEnvironment()
    calculator.step = _recording(calculator.step, rewards)
    record = _scripted_episode(calculator, ["calc(2+3)", "A:5"], _limits(), task={"expression": "2+3"})
    assert rewards == [1.0] and record.reward == 1.0 and record.num_turns == 2


def _recording(step, rewards):
    async def recorded(action):
        result = await step(action)
        rewards.append(result.reward)
        return result

    return recorded


# -- how an episode ends -----------------------------------------------------------------------------------


def test_done_ends_the_episode_at_once_and_its_observation_is_never_shown(drawn):
    """"A step with `done=True` ends the episode at once with status `ok`; its observation is not added
    to the conversation, so the policy never sees it.\""""
    environment = Scripted(replies=[StepResult("the final word\n", 1.0, True)])
    record = _episode(drawn, environment, _limits(max_turns=3))
    assert record.status == "ok" and record.num_turns == 1 and len(environment.actions) == 1
    assert b"the final word" not in _text(record)
    assert record.messages[-1].role == "assistant" and record.messages[-1].end == len(record.token_ids)


class CutOffGym:
    """A Gymnasium-style text environment that cuts itself off (``truncated``) after its first step."""

    def reset(self, seed=None, options=None):
        return "say something\n", {}

    def step(self, action):
        return "out of time\n", 0.3, False, True, {"left": 0}


def test_an_environments_own_cut_off_is_done_and_ends_the_episode_ok(drawn):
    """"An environment's own cut-off is `done` too: through the Gymnasium adapter (`done` is
    `terminated or truncated`) a Gymnasium `truncated` ends the episode `ok`.\""""
    environment = GymnasiumTextEnvironment(factory=f"{__name__}:CutOffGym")
    record = _episode(drawn, environment, _limits(max_turns=3), task={"seed": 0})
    assert record.status == "ok" and record.num_turns == 1 and record.reward == pytest.approx(0.3)


def test_a_steps_info_is_checked_but_neither_recorded_nor_used(drawn):
    """"A step's `info` is checked (it must be JSON) but neither recorded nor used.\""""
    kept = Scripted(replies=[StepResult("", 1.0, True, {"marker": "info-is-dropped", "done": False})])
    record = _episode(drawn, kept, _limits())
    assert record.status == "ok" and record.reward == 1.0
    assert "info-is-dropped" not in record.model_dump_json()
    assert "info-is-dropped" not in str(record.to_stream_fields())

    refused = Scripted(replies=[StepResult("", 1.0, True, {"when": object()})])
    record = _episode(drawn, refused, _limits())
    assert record.status == "failed" and record.failure_reason.startswith("step info is not JSON-serialisable")


def test_max_turns_truncates_with_the_reward_so_far_and_the_last_reply_appended(drawn, bigram):
    """"Otherwise the episode ends `truncated`, with the reason on the record and the reward summed so
    far, when

    - `max_turns` turns have run (`reached max_turns=3 before the environment ended the episode`),
      the last turn's observation or tool results already appended;\""""
    environment = Scripted(replies=[StepResult("again\n", 0.25, False), StepResult("again\n", 0.25, False),
                                    StepResult("never answered\n", 0.25, False)])
    record = _episode(drawn, environment, _limits(max_turns=3))
    assert record.status == "truncated" and record.num_turns == 3
    assert record.failure_reason == "reached max_turns=3 before the environment ended the episode"
    assert record.reward == pytest.approx(0.75)
    assert record.messages[-1].role == "user" and record.messages[-1].content == "never answered\n"

    tools = _episode(bigram, Scripted(prompt="call it>", tools=[_tool(Counted("ran>"))]), _limits(max_turns=3))
    assert tools.status == "truncated" and tools.failure_reason == record.failure_reason
    assert tools.messages[-1].role == "tool" and tools.messages[-1].content == "ran>"


def test_no_room_for_another_turn_truncates_with_the_reward_so_far(bigram):
    """"there is no room left for another turn: before each turn, the conversation plus `max_new_tokens`
    must fit in `model.max_seq_len` (`no room for turn 2: ...`);\""""
    # BOS "p!" (3) + "a" EOS (2) + 40 bytes of observation = 45 tokens; 45 + 8 > 50.
    environment = Scripted(prompt="p!", replies=[StepResult("b" * 39 + "!", 0.5, False)])
    record = _episode(bigram, environment, _limits(max_turns=5, max_seq_len=50))
    assert record.status == "truncated" and record.num_turns == 1 and len(record.token_ids) == 45
    assert record.failure_reason == ("no room for turn 2: 45 tokens in the conversation + max_new_tokens=8 "
                                     "> max_seq_len=50")
    assert record.reward == 0.5 and sum(record.loss_mask) == 2  # trained, not failed


def test_a_reply_that_does_not_fit_is_left_out_and_truncates(bigram):
    """"an observation or tool result would not fit in `max_seq_len` (`the environment's observation
    after turn 1 does not fit: ...`); nothing is cut mid-message: the reply is left out.\""""
    environment = Scripted(prompt="p!", replies=[StepResult("b" * 59 + "!", 0.5, False)])
    record = _episode(bigram, environment, _limits(max_turns=5, max_seq_len=50))
    assert record.status == "truncated" and record.reward == 0.5
    assert record.failure_reason.startswith("the environment's observation after turn 1 does not fit")
    # The reason names the overflow, not the next turn's budget (5 + max_new_tokens fits in 50).
    assert "5 tokens in the conversation before it, and it would take the conversation past max_seq_len=50" in (
        record.failure_reason)
    assert len(record.token_ids) == 5 and record.messages[-1].role == "assistant"

    tool_episode = Scripted(prompt="p>", tools=[_tool(Counted("c" * 59 + ">"))])
    record = _episode(bigram, tool_episode, _limits(max_turns=5, max_seq_len=64))
    assert record.status == "truncated" and record.messages[-1].role == "assistant"
    assert record.failure_reason.startswith("the tool results after turn 1 do not fit")


def test_a_prompt_without_room_for_the_first_turn_fails_the_episode(bigram):
    """"A prompt that leaves no room for even the first turn fails the episode.\""""
    record = _episode(bigram, Scripted(prompt="ppppp!"), _limits(max_seq_len=10))
    assert record.status == "failed" and record.num_turns == 0 and record.reward == 0.0
    assert record.failure_reason.startswith("the prompt alone leaves no room for a turn: 7 tokens")


# -- failures ----------------------------------------------------------------------------------------------


async def _hang():
    await asyncio.sleep(30)


async def _boom(arguments):
    raise RuntimeError("tool bug")


async def _hang_tool(arguments):
    await asyncio.sleep(30)


class LongReset(Scripted):
    async def reset(self, task):
        return "r" * 101


class HangingReset(Scripted):
    async def reset(self, task):
        await asyncio.sleep(30)


FAILING = {
    # Each pays 1.0 on its first step and fails on its second (steps), or fails on reset or its first call.
    "reset timeout": (HangingReset, "reset timed out after 0.5s"),
    "step timeout": (lambda: Scripted(replies=[StepResult("go on\n", 1.0, False), _hang]),
                     "step timed out after 0.5s"),
    "step raises": (lambda: Scripted(replies=[StepResult("go on\n", 1.0, False), KeyError("state")]),
                    "step raised KeyError: 'state'"),
    "malformed step": (lambda: Scripted(replies=[StepResult("go on\n", 1.0, False), StepResult("", 1, "yes")]),
                       "step done is str, expected bool"),
    "long observation": (lambda: Scripted(replies=[StepResult("go on\n", 1.0, False),
                                                   StepResult("o" * 101, 1.0, False)]),
                         "step returned an observation of 101 chars, more than max_observation_chars=100"),
    "long reset": (LongReset, "reset returned an observation of 101 chars, more than max_observation_chars=100"),
    "tool timeout": (lambda: Scripted(prompt="call>", tools=[_tool(_hang_tool)]), "tool go timed out after 0.5s"),
    "tool raises": (lambda: Scripted(prompt="call>", tools=[_tool(_boom)]), "tool go raised RuntimeError: tool bug"),
    "long tool result": (lambda: Scripted(prompt="call>", tools=[_tool(Counted("t" * 101))]),
                         "tool go returned an observation of 101 chars, more than max_observation_chars=100"),
}


@pytest.mark.parametrize("case", FAILING)
def test_an_environment_fault_fails_the_episode_with_reward_zero(drawn, bigram, case):
    """"An environment timeout (`rollout.environment_timeout_s`, on reset, on step and on each tool call),
    an exception from `reset`, `step` or a tool, a malformed result, or an observation longer than
    `rollout.max_observation_chars` (tool results included) ends the episode `failed` with reward 0,
    whatever its earlier steps earned;\""""
    make, reason = FAILING[case]
    environment = make()
    runtime = bigram if environment.tools else drawn
    record = _episode(runtime, environment, _limits(environment_timeout_s=0.5, max_observation_chars=100))
    assert record.status == "failed" and record.failure_reason == reason
    assert record.reward == 0.0 and sum(record.loss_mask) == 0
    if case.startswith(("step", "malformed", "long observation")):
        assert len(environment.actions) == 2  # the first step's 1.0 was earned, then taken back


def test_a_generation_failure_fails_the_episode_with_reward_zero(drawn):
    """"so does a generation failure.\""""
    # The agent's budget (limits) allows a prompt the engine (max_seq_len=256) cannot take.
    environment = Scripted(prompt="p" * 300)
    record = _episode(drawn, environment, _limits(max_seq_len=10_000))
    assert record.status == "failed" and record.reward == 0.0 and sum(record.loss_mask) == 0
    assert record.failure_reason.startswith("generation failed: ") and environment.actions == []


def test_a_tool_error_returned_as_its_result_reaches_the_policy(bigram):
    """"A tool that raises fails the episode: to tell the policy that a call went wrong, return the error
    as the tool's result.\""""
    raising = _episode(bigram, Scripted(prompt="call>", tools=[_tool(_boom)]), _limits(max_turns=2))
    assert raising.status == "failed" and raising.failure_reason == "tool go raised RuntimeError: tool bug"

    answering = _episode(bigram, Scripted(prompt="call>", tools=[_tool(Counted("error: no such file>"))]),
                         _limits(max_turns=2))
    assert answering.status == "truncated" and answering.num_turns == 2  # the policy went on after it
    assert answering.messages[2].role == "tool" and answering.messages[2].content == "error: no such file>"


def test_a_tool_result_is_the_str_of_any_value(bigram):
    """"A tool's result may be any value; its `str()` is the observation.\""""
    environment = Scripted(prompt="call>", tools=[_tool(Counted(result=4.5))])
    record = _episode(bigram, environment, _limits(max_turns=1))
    assert record.messages[-1].role == "tool" and record.messages[-1].content == "4.5"
    assert _text(record).endswith(b"go(1)4.5")


# -- what is trained ---------------------------------------------------------------------------------------


def test_a_failed_episode_is_kept_out_of_the_batch_and_of_its_groups_statistics(drawn):
    """"A failed episode's loss mask is all zeros, and the trainer (`Algorithm.prepare`,
    `trainer/algorithms.py`) keeps it out of the batch and out of its group's reward statistics.\""""
    ok = Scripted(replies=[StepResult("", 1.0, True)])
    truncated = Scripted(replies=[StepResult("again\n", 0.25, False)])
    failed = Scripted(replies=[StepResult("again\n", 1.0, False), RuntimeError("late bug")])
    records = _episodes(drawn, [ok, truncated, failed], _limits(max_turns=2))
    assert [r.status for r in records] == ["ok", "truncated", "failed"]
    assert sum(records[2].loss_mask) == 0 and len(records[2].token_ids) > 0
    for name in ("grpo", "dr_grpo", "rloo", "dapo"):
        algorithm = build_algorithm(AlgorithmConfig(name=name, overlong=None), max_policy_tokens=MAX_NEW_TOKENS * 2)
        prepared = algorithm.prepare([records])
        assert [r.status for r in prepared.records] == ["ok", "truncated"], name
        assert prepared.stats["episodes_failed"] == 1.0 and prepared.stats["reward_mean"] == pytest.approx(0.75)
        # The same advantages as a group that never had the failed episode: it moved no baseline.
        without = algorithm.prepare([records[:2]])
        assert prepared.advantages.tolist() == pytest.approx(without.advantages.tolist()), name


def test_truncated_episodes_are_trained_with_the_reward_they_had_and_in_the_baseline(drawn):
    """"Truncated episodes are trained like `ok` ones: with the reward they had when they were cut off,
    and in their group's baseline; no algorithm penalises the status itself.\""""
    ok = Scripted(replies=[StepResult("", 0.5, True)])
    truncated = Scripted(replies=[StepResult("again\n", 0.25, False)])
    records = _episodes(drawn, [ok, truncated, Scripted(replies=[StepResult("", 0.0, True)])],
                        _limits(max_turns=2))
    assert [r.status for r in records] == ["ok", "truncated", "ok"] and records[1].reward == 0.5
    assert sum(records[1].loss_mask) > 0  # its policy tokens are trained on
    as_ok = [records[0], records[1].model_copy(update={"status": "ok", "failure_reason": ""}), records[2]]
    for name in ("grpo", "dr_grpo", "rloo", "dapo"):
        algorithm = build_algorithm(AlgorithmConfig(name=name, overlong=None), max_policy_tokens=MAX_NEW_TOKENS * 2)
        prepared = algorithm.prepare([records])
        assert [r.status for r in prepared.records] == ["ok", "truncated", "ok"], name
        assert prepared.rewards.tolist() == pytest.approx([0.5, 0.5, 0.0]), name
        same = algorithm.prepare([as_ok])
        assert prepared.advantages.tolist() == pytest.approx(same.advantages.tolist()), name
        assert prepared.advantages[0] == pytest.approx(prepared.advantages[1]), name  # one baseline


def test_overlong_shaping_penalises_policy_tokens_whatever_the_status(bigram):
    """"DAPO's `algorithm.overlong` shaping penalises length in policy tokens, whatever the status.\""""
    # Both episodes say "a" EOS once: 2 policy tokens; the soft limit is 1, so each loses the full 1.0.
    ok = Scripted(prompt="p!", replies=[StepResult("", 1.0, True)])
    truncated = Scripted(prompt="p!", replies=[StepResult("!", 0.5, False)])
    records = _episodes(bigram, [ok, truncated], _limits(max_turns=1))
    assert [(r.status, sum(r.loss_mask)) for r in records] == [("ok", 2), ("truncated", 2)]
    algorithm = build_algorithm(AlgorithmConfig(name="dapo", overlong={"max_length": 2, "cache_length": 1}))
    prepared = algorithm.prepare([records])
    assert prepared.rewards.tolist() == pytest.approx([0.0, -0.5])


def test_an_environment_that_pays_only_at_its_end_gives_cut_off_episodes_nothing(drawn):
    """"An environment whose cut-off episodes should earn nothing pays only on its last step.\""""
    environment = GuessingGameEnvironment(retry_malformed=True)
    record = _episode(drawn, environment, _limits(max_turns=3), task={"target": 37})
    assert record.status == "truncated" and record.num_turns == 3 and record.reward == 0.0
