"""Environment adapters: remote HTTP (against a real uvicorn server), Gymnasium-style, reasoning-gym."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from pathlib import Path

import httpx
import pytest
from flax import nnx

from environments import http_example_server
from environments.adapters.http import (
    RemoteEnvironmentError,
    RemoteHTTPEnvironment,
    SharedHTTPSession,
    shared_http_session,
)
from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import VOCAB_SIZE, ByteTokenizer
from policy.weights import RedisWeightPublisher
from tandem.configs.rollout import RolloutConfig, SamplingConfig
from tandem.configs.run import ModelConfig, RunConfig
from tandem.contracts import (
    EnvironmentSpec,
    RunSpec,
    TrajectoryRecord,
    run_spec_key,
    trajectory_stream,
)
from tandem.runtime.local_ports import free_local_port
from workers.policy import PolicyRuntime
from workers.producer import produce_groups

REPO_ROOT = Path(__file__).resolve().parents[2]

CONFIG = RunConfig(
    model=ModelConfig(d_model=32, num_layers=1, num_heads=2, mlp_dim=64, max_seq_len=128),
    rollout=RolloutConfig(group_size=3, max_turns=2, environment_timeout_s=0.5),
    sampling=SamplingConfig(max_new_tokens=8),
)


@pytest.fixture(scope="module")
def server_url():
    try:
        with http_example_server.running(ready_timeout_s=20) as url:
            yield url
    except http_example_server.ServerNotHealthyError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def producer(redis_url):
    """One published random policy and its warm sampler, shared by the module's episodes."""
    import redis

    client = redis.Redis.from_url(redis_url)
    run_id = random.randint(10**8, 10**9)
    model = Transformer(TransformerConfig.from_model_config(CONFIG.model, VOCAB_SIZE), rngs=nnx.Rngs(0))
    RedisWeightPublisher(client).publish(run_id=run_id, version=3, params=split_model(model)[1])
    runtime = PolicyRuntime(run_id=run_id, config=CONFIG, redis_client=client)
    runtime.refresh_weights(force=True)

    def produce(environment: EnvironmentSpec, *, environment_timeout_s: float | None = None) -> list[TrajectoryRecord]:
        config = CONFIG if environment_timeout_s is None else CONFIG.model_copy(update={
            "rollout": CONFIG.rollout.model_copy(update={"environment_timeout_s": environment_timeout_s})})
        spec = RunSpec(run_id=run_id, config=config, environment=environment)
        client.set(run_spec_key(run_id), spec.model_dump_json())
        # The episodes' limits come from the runtime's config (the run's, as producers load it).
        runtime.config = config
        try:
            asyncio.run(produce_groups(redis_url=redis_url, spec=spec, runtime=runtime,
                                       first_group_index=0, num_groups=1))
        finally:
            runtime.config = CONFIG
        records = [TrajectoryRecord.from_stream_fields(f) for _, f in client.xrange(trajectory_stream(run_id))]
        return [r for r in records if r.environment == environment.name]

    yield produce
    runtime.close()
    client.close()


def _remote(name: str, url: str, **params) -> EnvironmentSpec:
    return EnvironmentSpec(name=name, kind="python", entrypoint="environments.adapters.http:RemoteHTTPEnvironment",
                           settings={"url": url, "backoff_s": 0.01, **params})


# -- remote HTTP ------------------------------------------------------------


def test_remote_calculator_episode_uses_the_remote_tool_and_scores_the_answer(server_url):
    async def episode():
        environment = RemoteHTTPEnvironment(url=server_url)
        task = environment.sample_task(random.Random(1))
        assert task == RemoteHTTPEnvironment(url=server_url).sample_task(random.Random(1))  # a group shares it
        prompt = await environment.reset(task)
        assert [tool.name for tool in environment.tools] == ["calc"] and environment.name == "calculator"
        expression = prompt.removesuffix("=?\n")
        result = await environment.tools[0].run({"expression": expression})
        answer = int(result.strip().removeprefix("="))
        step = await environment.step(f"A:{answer}")
        await environment.close()
        return step

    step = asyncio.run(episode())
    assert (step.reward, step.done, step.info) == (1.0, True, {"outcome": "correct"})


def test_remote_episodes_stream_through_the_producer_with_the_real_sampler(server_url, producer):
    records = producer(_remote("remote-calculator", server_url))
    assert len(records) == 3
    for record in records:
        assert record.status == "ok", record.failure_reason
        assert record.policy_version == 3 and record.num_turns >= 1
        assert sum(record.loss_mask) > 0 and record.loss_mask[0] == 0
    prompt = ByteTokenizer().decode(records[0].token_ids)
    assert "=?" in prompt  # the server's observation is the prompt


@pytest.mark.parametrize(("fault", "reason"), [
    ("garbage-json", "step raised RemoteEnvironmentError: POST /step: response is not JSON"),
    ("missing-field", "step raised RemoteEnvironmentError: POST /step: response has no 'reward'"),
    ("wrong-type", "step raised RemoteEnvironmentError: POST /step: 'done' is str, expected bool"),
    ("huge-observation", "reset raised RemoteEnvironmentError: POST /reset: observation of 1000000 chars "
                         "exceeds max_observation_chars=8192"),
    ("hang", "reset timed out after 0.5s"),
])
def test_a_misbehaving_server_fails_episodes_with_the_reason(server_url, producer, fault, reason):
    records = producer(_remote(f"remote-{fault}", f"{server_url}/faults/{fault}"))
    assert len(records) == 3
    for record in records:
        assert record.status == "failed" and record.failure_reason.startswith(reason), record.failure_reason
        assert sum(record.loss_mask) == 0 and record.reward == 0.0


def test_transient_5xx_on_reset_is_retried_and_the_episode_succeeds(server_url, producer):
    records = producer(_remote("remote-flaky", f"{server_url}/faults/flaky", retries=2))
    assert [r.status for r in records] == ["ok"] * 3


def test_transient_5xx_beyond_the_retry_budget_fails_the_episode(server_url):
    environment = RemoteHTTPEnvironment(url=f"{server_url}/faults/flaky", retries=1, backoff_s=0.01)
    with pytest.raises(RemoteEnvironmentError, match=r"POST /reset failed after 2 attempts: .*HTTP 503"):
        asyncio.run(environment.reset({"expression": "2*3"}))


def test_a_server_that_is_down_fails_the_episode_after_retries(producer):
    records = producer(_remote("remote-down", f"http://127.0.0.1:{free_local_port()}", retries=1))
    assert all(r.status == "failed" and r.failure_reason.startswith(
        "reset raised RemoteEnvironmentError: GET /schema failed after 2 attempts: ClientConnectorError")
        for r in records)


@contextlib.asynccontextmanager
async def _scripted_server(answer, *, port: int = 0):
    """A real HTTP/1.1 server on a local port that answers each request with ``answer(path)``.

    ``answer`` returns ``(status, json_body)``, or None to hang up without
    answering, as a server that crashed mid-request would. Yields the URL and
    the paths of every request that reached it. The example server cannot
    misbehave at the transport level like this.
    """
    paths: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                length = next((int(line.split(":", 1)[1]) for line in head[1:]
                               if line.lower().startswith("content-length:")), 0)
                await reader.readexactly(length)
                paths.append(head[0].split(" ")[1])
                reply = answer(paths[-1])
                if reply is None:
                    break
                status, payload = reply
                body = json.dumps(payload).encode() if not isinstance(payload, bytes) else payload
                writer.write(b"HTTP/1.1 %d Scripted\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % (status, len(body)) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", paths


def _stepping_environment(url: str, **params) -> RemoteHTTPEnvironment:
    environment = RemoteHTTPEnvironment(url=url, **{"backoff_s": 0.0, "retries": 2, **params})
    environment._episode_id = "episode"  # as after a reset
    return environment


async def _against(answer, act):
    """``act(environment)`` against a scripted server; its result and the paths the server saw."""
    async with _scripted_server(answer) as (url, paths):
        environment = _stepping_environment(url)
        try:
            return await act(environment), paths
        finally:
            await environment.close()


def test_a_step_is_resent_only_when_the_connection_was_never_made():
    port = free_local_port()

    async def scenario():
        environment = _stepping_environment(f"http://127.0.0.1:{port}", backoff_s=0.5)
        started = time.monotonic()
        # The first attempt is refused at once: nothing listens on the port yet.
        stepping = asyncio.ensure_future(environment.step("A:1"))
        await asyncio.sleep(0.2)
        done = {"observation": "", "reward": 1, "done": True, "info": {}}
        async with _scripted_server(lambda path: (200, done), port=port) as (_, paths):
            result = await stepping
        await environment.close()
        return result, paths, time.monotonic() - started

    result, paths, elapsed_s = asyncio.run(scenario())
    assert result.reward == 1.0 and paths == ["/step"]
    assert elapsed_s >= 0.5  # the answer came from the retry, after the backoff


@pytest.mark.parametrize("failure", ["hang-up", "503"])
def test_a_step_that_may_have_been_applied_is_never_resent(failure):
    def failing(path):
        return None if failure == "hang-up" else (503, {"error": "overloaded"})

    async def step(environment):
        with pytest.raises(RemoteEnvironmentError) as raised:
            await environment.step("A:1")
        return str(raised.value)

    message, paths = asyncio.run(_against(failing, step))
    assert paths == ["/step"]
    assert ("may have been applied" in message) if failure == "hang-up" else ("HTTP 503" in message)


def test_a_reward_of_the_wrong_type_is_a_protocol_error_not_a_number():
    def boolean_reward(path):
        return 200, {"observation": "", "reward": True, "done": True, "info": {}}

    async def step(environment):
        with pytest.raises(RemoteEnvironmentError, match="'reward' is bool, expected int or float"):
            await environment.step("A:1")

    asyncio.run(_against(boolean_reward, step))


def test_a_schema_of_another_protocol_version_is_refused():
    def future_schema(path):
        return 200, {"name": "x", "tools": [], "protocol_version": 2}

    async def reset(environment):
        with pytest.raises(RemoteEnvironmentError, match="protocol_version 2"):
            await environment.reset({"expression": "1+1"})

    _, paths = asyncio.run(_against(future_schema, reset))
    assert paths == ["/schema"]


def test_a_silent_server_times_out_as_the_servers_failure_not_the_agents():
    """aiohttp's read timeout is a TimeoutError; it must not read as the agent's own environment timeout."""
    async def silent(reader, writer):
        await asyncio.sleep(5)
        writer.close()

    async def scenario():
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        async with server:
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            environment = RemoteHTTPEnvironment(url=url, timeout_s=0.2, retries=1, backoff_s=0.0)
            try:
                with pytest.raises(RemoteEnvironmentError) as raised:
                    await environment.health()
            finally:
                await environment.close()
        return str(raised.value)

    message = asyncio.run(scenario())
    assert message.startswith("GET /health failed after 2 attempts: SocketTimeoutError"), message


# -- Gymnasium-style text environments ----------------------------------------


class WordEcho:
    """A Gymnasium-style text environment: repeat the word; three tries, then truncated."""

    closed = 0

    def __init__(self, words=("apple", "pear", "plum")):
        self.words = words

    def reset(self, seed=None, options=None):
        self.word = random.Random(seed).choice(self.words)
        self.tries = 0
        return f"say {self.word}\n", {"seed": seed}

    def step(self, action):
        self.tries += 1
        if action.strip() == self.word:
            return "", 1.0, True, False, {}
        return "no\n", 0.0, False, self.tries >= 3, {"tries": self.tries}

    def close(self):
        type(self).closed += 1


def _gym(**params):
    from environments.adapters.gymnasium_text import GymnasiumTextEnvironment

    return GymnasiumTextEnvironment(factory=f"{__name__}:WordEcho", **params)


def test_gymnasium_text_environment_plays_through_its_api():
    async def episode():
        environment = _gym(factory_kwargs={"words": ["kiwi"]})
        task = environment.sample_task(random.Random(0))
        prompt = await environment.reset(task)
        wrong = await environment.step("fig")
        right = await environment.step("kiwi")
        await environment.close()
        return prompt, wrong, right

    closed_before = WordEcho.closed
    prompt, wrong, right = asyncio.run(episode())
    assert prompt == "say kiwi\n"
    assert (wrong.observation, wrong.reward, wrong.done) == ("no\n", 0.0, False)
    assert (right.reward, right.done, right.info["terminated"]) == (1.0, True, True)
    assert WordEcho.closed == closed_before + 1


def test_gymnasium_truncation_ends_the_episode_and_a_group_shares_the_seed():
    async def first_prompt_and_last_step(seed):
        environment = _gym()
        prompt = await environment.reset({"seed": seed})
        steps = [await environment.step("wrong") for _ in range(3)]
        return prompt, steps[-1]

    (prompt_a, last), (prompt_b, _) = asyncio.run(first_prompt_and_last_step(7)), asyncio.run(
        first_prompt_and_last_step(7))
    assert prompt_a == prompt_b and last.done and last.info == {"tries": 3, "terminated": False, "truncated": True}


def test_gymnasium_episodes_stream_through_the_producer(producer):
    spec = EnvironmentSpec(name="word-echo", kind="python",
                           entrypoint="environments.adapters.gymnasium_text:GymnasiumTextEnvironment",
                           settings={"factory": f"{__name__}:WordEcho"})
    # Its reset builds the environment in a thread: on a loaded CI machine that took more than
    # the module's half second, which is for the fault tests.
    records = producer(spec, environment_timeout_s=10.0)
    # An untrained policy rarely echoes the word: its episodes end, or are cut off with the reason.
    assert len(records) == 3 and all(
        r.status == "ok" or (r.status == "truncated" and ("max_turns" in r.failure_reason
                                                          or "max_seq_len" in r.failure_reason))
        for r in records), [(r.status, r.failure_reason) for r in records]
    assert all(ByteTokenizer().decode(r.token_ids).count("say ") == 1 for r in records)


def test_gymnasium_factory_must_name_a_callable():
    from environments.adapters.gymnasium_text import GymnasiumTextEnvironment

    with pytest.raises(ValueError, match="not of the form .package.module:Name."):
        GymnasiumTextEnvironment(factory="WordEcho")


# -- reasoning-gym ------------------------------------------------------------


def _reasoning(**params):
    from environments.adapters.reasoning_gym import ReasoningGymEnvironment

    return ReasoningGymEnvironment(dataset="leg_counting", size=20, seed=1, **params)


def test_reasoning_gym_scores_answers_with_the_dataset():
    environment = _reasoning()

    async def answer(index, text):
        await environment.reset({"index": index})
        return await environment.step(text)

    entry = environment.dataset[3]
    right = asyncio.run(answer(3, f"A:{entry['answer']}"))
    tagged = asyncio.run(answer(3, f"thinking... <answer>{entry['answer']}</answer>"))
    wrong = asyncio.run(answer(3, "A:-1"))
    assert (right.reward, right.done) == (1.0, True) and tagged.reward == 1.0
    assert (wrong.reward, wrong.done) == (0.0, True)


def test_reasoning_gym_multi_turn_gives_feedback_and_discounts_retries():
    environment = _reasoning(max_attempts=3, attempt_discount=0.5)
    entry = environment.dataset[0]

    async def episode():
        prompt = await environment.reset({"index": 0})
        return prompt, [await environment.step(a) for a in ("A:-1", f"A:{entry['answer']}")]

    prompt, (wrong, right) = asyncio.run(episode())
    assert entry["question"] in prompt
    assert (wrong.observation, wrong.done) == ("Incorrect. 2 attempts left.\n", False)
    assert (right.reward, right.done, right.info["attempts"]) == (0.5, True, 2)


def test_reasoning_gym_demonstrations_are_correct_answers():
    environment = _reasoning()
    for demo in environment.demonstrations(5, random.Random(0)):
        entry = next(e for e in environment.dataset if e["question"] in demo.prompt)
        assert environment.dataset.score_answer(demo.turns[0].text.removeprefix("A:"), entry) == 1.0


# -- OpenEnv ------------------------------------------------------------------


@pytest.fixture(scope="module")
def openenv_url():
    """A real OpenEnv server (its FastAPI app under uvicorn, in a thread) hosting a tiny echo game."""
    import threading

    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment as OpenEnvBase
    from openenv.core.env_server.types import Action, Observation, State

    class EchoAction(Action):
        message: str

    class EchoObservation(Observation):
        prompt: str = ""

    class EchoGame(OpenEnvBase):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.word = random.Random(seed).choice(["red", "green", "blue"])
            return EchoObservation(prompt=f"say {self.word}\n")

        def step(self, action, timeout_s=None, **kwargs):
            right = action.message.strip() == self.word
            return EchoObservation(prompt="" if right else "again\n", reward=1.0 if right else 0.0, done=right,
                                   metadata={"word": self.word})

        @property
        def state(self):
            return State()

    app = create_fastapi_app(EchoGame, EchoAction, EchoObservation, max_concurrent_envs=8)
    port = free_local_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            pytest.fail("the OpenEnv server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_openenv_episode_maps_text_to_actions_and_observations(openenv_url):
    from environments.adapters.openenv import OpenEnvEnvironment

    async def episode():
        environment = OpenEnvEnvironment(url=openenv_url, action_field="message", observation_field="prompt")
        prompt = await environment.reset({"seed": 3})
        word = prompt.split()[1]
        wrong = await environment.step("purple")
        right = await environment.step(word)
        await environment.close()
        return prompt, wrong, right, word

    prompt, wrong, right, word = asyncio.run(episode())
    assert prompt == f"say {word}\n"
    assert (wrong.observation, wrong.reward, wrong.done) == ("again\n", 0.0, False)
    assert (right.reward, right.done) == (1.0, True)


def test_openenv_observation_without_the_field_fails_with_the_reason(openenv_url):
    from environments.adapters.openenv import OpenEnvEnvironment, OpenEnvError

    async def episode():
        environment = OpenEnvEnvironment(url=openenv_url, observation_field="text")
        try:
            await environment.reset({"seed": 1})
        finally:
            await environment.close()

    with pytest.raises(OpenEnvError, match="reset: observation has no 'text'"):
        asyncio.run(episode())


def test_openenv_episodes_stream_through_the_producer(openenv_url, producer):
    spec = EnvironmentSpec(name="openenv-echo", kind="python",
                           entrypoint="environments.adapters.openenv:OpenEnvEnvironment",
                           settings={"url": openenv_url})
    records = producer(spec)
    # The echo server never ends an episode: max_turns does, and says so.
    assert len(records) == 3 and all(
        r.status == "truncated" and r.failure_reason.startswith("reached max_turns=") for r in records
    ), [(r.status, r.failure_reason) for r in records]
    assert '"prompt": "say ' in ByteTokenizer().decode(records[0].token_ids)


# -- the shared HTTP session (a producer's episode loop) ---------------------------


async def _remote_episode(url: str) -> float:
    environment = RemoteHTTPEnvironment(url=url)
    try:
        prompt = await environment.reset(environment.sample_task(random.Random(5)))
        result = await environment.tools[0].run({"expression": prompt.removesuffix("=?\n")})
        step = await environment.step(f"A:{result.strip().removeprefix('=')}")
        return step.reward
    finally:
        await environment.close()


def _episodes_against_a_fresh_server(*, rounds: int, per_round: int, shared: SharedHTTPSession | None) -> tuple:
    with http_example_server.running(ready_timeout_s=20) as url:
        async def play():
            if shared is not None:
                shared_http_session.set(shared)
            rewards = []
            for _ in range(rounds):
                rewards += await asyncio.gather(*(_remote_episode(url) for _ in range(per_round)))
            if shared is not None:
                await shared.aclose()
            return rewards

        before = httpx.get(f"{url}/stats").json()
        rewards = asyncio.run(play())
        after = httpx.get(f"{url}/stats").json()
    # Each /stats request comes on a connection of its own: the second one is not the episodes'.
    return rewards, after["requests"], after["connections"] - before["connections"] - 1


def test_episodes_of_one_loop_share_connections_and_fetch_the_schema_once():
    rewards, requests, connections = _episodes_against_a_fresh_server(rounds=3, per_round=8,
                                                                      shared=SharedHTTPSession())
    assert rewards == [1.0] * 24
    assert requests["POST /reset"] == 24
    assert requests["GET /schema"] == 1
    # 8 episodes at a time need at most 8 connections; later rounds reuse them.
    assert 1 <= connections <= 8


def test_without_a_shared_session_each_episode_connects_and_fetches_the_schema():
    rewards, requests, connections = _episodes_against_a_fresh_server(rounds=2, per_round=4, shared=None)
    assert rewards == [1.0] * 8
    assert requests["GET /schema"] == 8
    assert connections == 8


def test_a_schema_is_refetched_after_its_ttl_and_a_failed_fetch_is_not_kept():
    now = [0.0]
    shared = SharedHTTPSession(schema_ttl_s=60, clock=lambda: now[0])
    fetches = []

    async def fetch():
        fetches.append(now[0])
        if len(fetches) == 2:
            raise RemoteEnvironmentError("GET /schema: HTTP 503")
        return {"fetch": len(fetches)}

    async def scenario():
        first = await asyncio.gather(*(shared.schema("http://a", fetch) for _ in range(5)))
        now[0] = 59.0
        cached = await shared.schema("http://a", fetch)
        now[0] = 61.0
        with pytest.raises(RemoteEnvironmentError):
            await shared.schema("http://a", fetch)
        after_failure = await shared.schema("http://a", fetch)
        other_url = await shared.schema("http://b", fetch)
        return first, cached, after_failure, other_url

    first, cached, after_failure, other_url = asyncio.run(scenario())
    assert first == [{"fetch": 1}] * 5 and cached == {"fetch": 1}
    assert after_failure == {"fetch": 3} and other_url == {"fetch": 4}
    assert fetches == [0.0, 61.0, 61.0, 61.0]


def test_an_episode_timing_out_does_not_cancel_the_schema_fetch_others_wait_for():
    shared = SharedHTTPSession()

    async def slow_fetch():
        await asyncio.sleep(0.2)
        return {"name": "slow"}

    async def scenario():
        impatient = asyncio.ensure_future(asyncio.wait_for(shared.schema("http://a", slow_fetch), 0.05))
        patient = asyncio.ensure_future(shared.schema("http://a", slow_fetch))
        with pytest.raises(TimeoutError):
            await impatient
        return await patient

    assert asyncio.run(scenario()) == {"name": "slow"}


def test_any_python_environment_can_be_served_and_played_remotely_turn_by_turn():
    with http_example_server.running(
            environment="environments.builtin.guessing_game:GuessingGameEnvironment", settings={"high": 16}) as url:
        async def bisect():
            environment = RemoteHTTPEnvironment(url=url)
            task = environment.sample_task(random.Random(2))
            prompt = await environment.reset(task)
            low, high, hints = 1, 16, []
            while True:
                guess = (low + high) // 2
                step = await environment.step(f"A:{guess}")
                if step.done:
                    await environment.close()
                    return prompt, environment.name, hints, step
                hints.append(step.observation)
                low, high = (guess + 1, high) if step.observation == "higher\n" else (low, guess - 1)

        prompt, name, hints, last = asyncio.run(bisect())
    assert prompt == "Guess 1-16.\n" and name == "GuessingGameEnvironment"
    assert last.info["outcome"] == "found" and last.reward == pytest.approx(0.9 ** len(hints))
    assert set(hints) <= {"higher\n", "lower\n"}
