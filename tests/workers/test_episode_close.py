"""Episodes end cleanly: every episode that reached a remote environment is closed once, with why.

Real servers (the example HTTP server in a subprocess, an OpenEnv server under
uvicorn), the real sampler and the producer's own code; nothing of ours is mocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading

import httpx
import pytest
from flax import nnx

from environments import SharedHTTPSession, http_example_server, shared_http_session
from environments.builtin.calculator import CalculatorEnvironment
from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import VOCAB_SIZE
from policy.weights import RedisWeightPublisher
from tandem.configs.rollout import RolloutConfig, SamplingConfig
from tandem.configs.run import ModelConfig, RunConfig
from tandem.contracts import (
    EnvironmentSpec,
    EpisodeCloseReason,
    ProbeRequest,
    ProbeTimeouts,
    RunSpec,
    ToolSchema,
    TrajectoryRecord,
    run_spec_key,
    trajectory_stream,
)
from tandem.runtime.local_ports import free_local_port
from tests.polling import poll_until
from workers.agent import EpisodeLimits, run_episode
from workers.policy import BatchingPolicy, PolicyRuntime
from workers.probe import run_probe
from workers.producer import produce_groups

CONFIG = RunConfig(
    model=ModelConfig(d_model=32, num_layers=1, num_heads=2, mlp_dim=64, max_seq_len=128),
    rollout=RolloutConfig(group_size=3, max_turns=2, environment_timeout_s=0.5),
    sampling=SamplingConfig(max_new_tokens=8),
)
# Malformed guesses cost a guess and the game goes on: a random policy's episodes meet max_turns.
ENDLESS_GUESSING = {"environment": "environments.builtin.guessing_game:GuessingGameEnvironment",
                    "settings": {"max_guesses": 50, "retry_malformed": True}}
# How long a test waits for a server to see what the episodes did, before failing.
SETTLE_TIMEOUT_S = 30


class Producer:
    """A published random policy and its warm sampler, producing groups as a rollout task does."""

    def __init__(self, redis_url: str):
        import redis

        self.redis_url = redis_url
        self.client = redis.Redis.from_url(redis_url)
        self.run_id = random.randint(10**8, 10**9)
        model = Transformer(TransformerConfig.from_model_config(CONFIG.model, VOCAB_SIZE), rngs=nnx.Rngs(0))
        RedisWeightPublisher(self.client).publish(run_id=self.run_id, version=1, params=split_model(model)[1])
        self.runtime = PolicyRuntime(run_id=self.run_id, config=CONFIG, redis_client=self.client)
        self.runtime.refresh_weights(force=True)

    async def group(self, environment: EnvironmentSpec) -> list[TrajectoryRecord]:
        """One group of ``environment``'s episodes, on the running loop (and its shared HTTP session, if set)."""
        spec = RunSpec(run_id=self.run_id, config=CONFIG, environment=environment)
        self.client.set(run_spec_key(self.run_id), spec.model_dump_json())
        await produce_groups(redis_url=self.redis_url, spec=spec, runtime=self.runtime, first_group_index=0,
                             num_groups=1)
        stream = trajectory_stream(self.run_id)
        records = [TrajectoryRecord.from_stream_fields(fields) for _, fields in self.client.xrange(stream)]
        self.client.delete(stream)
        return records

    def __call__(self, environment: EnvironmentSpec) -> list[TrajectoryRecord]:
        return asyncio.run(self.group(environment))

    def close(self) -> None:
        self.runtime.close()
        self.client.delete(run_spec_key(self.run_id), trajectory_stream(self.run_id))
        self.client.close()


@pytest.fixture(scope="module")
def producer(redis_url):
    made = Producer(redis_url)
    yield made
    made.close()


def _http(name: str, url: str) -> EnvironmentSpec:
    return EnvironmentSpec(name=name, kind="python", entrypoint="environments.adapters.http:RemoteHTTPEnvironment",
                           settings={"url": url, "backoff_s": 0.01},
                           tools=tuple(ToolSchema(name=tool.name, description=tool.description,
                                                  parameters=tool.parameters)
                                       for tool in CalculatorEnvironment().tools))


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/stats", timeout=5).json()


def _wait_for(condition, what: str):
    poll_until(condition, timeout_s=SETTLE_TIMEOUT_S, interval_s=0.02, what=what)


def _assert_each_reset_closed_once(url: str) -> dict[str, int]:
    episodes = _stats(url)["episodes"]
    assert episodes["open"] == 0 and episodes["closed_unknown"] == 0, episodes
    assert episodes["closed"] == episodes["reset"], episodes
    return episodes["close_reasons"]


def _cancelled_episode(runtime: PolicyRuntime, url: str) -> None:
    """One episode against a server whose step never answers, cancelled once the step is out."""
    from environments.adapters.http import RemoteHTTPEnvironment

    async def episode():
        policy = BatchingPolicy(runtime, seed=0)
        limits = EpisodeLimits(max_turns=2, max_seq_len=128, max_new_tokens=8, environment_timeout_s=60)
        running = asyncio.ensure_future(run_episode(
            run_id=runtime.run_id, group_id="cancelled-0", group_size=1, environment_name="hang-step",
            environment=RemoteHTTPEnvironment(url=f"{url}/faults/hang-step"), task={"expression": "2*3"},
            policy=policy, limits=limits, tokenizer=runtime.tokenizer, layout=runtime.prompt_layout))
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            while _stats(url)["requests"].get("POST /faults/hang-step/step", 0) < 1:
                await asyncio.sleep(0.02)
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await policy.close()

    asyncio.run(episode())


def test_the_server_sees_one_close_per_reset_for_done_failed_cancelled_and_probe_episodes(producer):
    with http_example_server.running() as url:
        done = producer(_http("calculator", url))
        failed_step = producer(_http("wrong-type", f"{url}/faults/wrong-type"))
        failed_reset = producer(_http("hang", f"{url}/faults/hang"))  # reset sent, never answered
        _cancelled_episode(producer.runtime, url)
        probe = run_probe(ProbeRequest(probe_id=1, purpose="registration", environment=_http("probe", url),
                                       timeouts=ProbeTimeouts(reset=5, step=5, close=5)))

        assert [r.status for r in done] == ["ok"] * 3
        assert all(r.failure_reason.startswith("step raised RemoteEnvironmentError") for r in failed_step)
        assert all(r.failure_reason == "reset timed out after 0.5s" for r in failed_reset)
        assert probe.passed, probe.checks
        reasons = _assert_each_reset_closed_once(url)
    assert reasons == {EpisodeCloseReason.DONE: 3, EpisodeCloseReason.FAILED: 6,
                       EpisodeCloseReason.CANCELLED: 1, EpisodeCloseReason.PROBE: 1}


def test_episodes_that_reach_max_turns_are_closed_once_as_max_turns(producer):
    with http_example_server.running(**ENDLESS_GUESSING) as url:
        records = producer(_http("guessing", url))

        assert all(r.status == "truncated" and r.failure_reason.startswith("reached max_turns=2")
                   for r in records), [(r.status, r.failure_reason) for r in records]
        assert _assert_each_reset_closed_once(url) == {EpisodeCloseReason.MAX_TURNS: 3}


def test_a_server_without_close_is_asked_no_more_in_that_session_and_its_episodes_succeed(producer):
    async def two_groups(url: str):
        shared = SharedHTTPSession()
        shared_http_session.set(shared)  # as the producer's episode loop does, for all its tasks
        try:
            first = await producer.group(_http("minimal", url))
            asked = _stats(server)["requests"]["POST /faults/minimal/close"]
            return first, asked, await producer.group(_http("minimal", url))
        finally:
            await shared.aclose()

    with http_example_server.running() as server:
        first, asked, second = asyncio.run(two_groups(f"{server}/faults/minimal"))

        assert [r.status for r in first + second] == ["ok"] * 6
        # The first group's episodes end together and may each ask before one answer is back.
        assert 1 <= asked <= CONFIG.rollout.group_size
        assert _stats(server)["requests"]["POST /faults/minimal/close"] == asked


# -- OpenEnv ------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def openenv_server():
    """A real OpenEnv server (openenv-core's FastAPI app under uvicorn) of a game that never ends,
    whose step waits while ``slow`` is set; yields its URL, the uvicorn server and its log records."""
    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment as OpenEnvBase
    from openenv.core.env_server.types import Action, Observation, State

    release = threading.Event()
    release.set()

    class EchoAction(Action):
        message: str

    class EchoObservation(Observation):
        prompt: str = ""

    class EndlessEcho(OpenEnvBase):
        SUPPORTS_CONCURRENT_SESSIONS = True
        steps = 0

        def reset(self, seed=None, episode_id=None, **kwargs):
            return EchoObservation(prompt="say anything\n")

        def step(self, action, timeout_s=None, **kwargs):
            type(self).steps += 1
            release.wait(SETTLE_TIMEOUT_S)
            return EchoObservation(prompt="again\n", reward=0.0, done=False)

        @property
        def state(self):
            return State()

    records = _Records()
    uvicorn_logger = logging.getLogger("uvicorn")
    uvicorn_logger.addHandler(records)
    app = create_fastapi_app(EndlessEcho, EchoAction, EchoObservation, max_concurrent_envs=8)
    port = free_local_port()
    # log_config=None: uvicorn's loggers stay as they are, with the handler above on them.
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait_for(lambda: server.started, "the OpenEnv server to start")
    try:
        yield f"http://127.0.0.1:{port}", server, records, release, EndlessEcho
    finally:
        release.set()
        server.should_exit = True
        thread.join(timeout=10)
        uvicorn_logger.removeHandler(records)


def test_openenv_sessions_end_without_a_traceback_on_the_server(producer, openenv_server):
    from environments.adapters.openenv import OpenEnvEnvironment

    url, server, records, release, game = openenv_server
    spec = EnvironmentSpec(name="openenv-endless", kind="python",
                           entrypoint="environments.adapters.openenv:OpenEnvEnvironment",
                           settings={"url": url, "observation_field": "prompt"})
    episodes = producer(spec)
    probe = run_probe(ProbeRequest(probe_id=2, purpose="registration", environment=spec))

    async def cancelled_mid_step():
        # The server is still answering the step when the episode is cancelled and closed.
        release.clear()
        environment = OpenEnvEnvironment(url=url, observation_field="prompt")
        await environment.reset({"seed": 1})
        steps_before = game.steps
        step = asyncio.ensure_future(environment.step("hello"))
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            while game.steps == steps_before:
                await asyncio.sleep(0.02)
        step.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await step
        release.set()
        await environment.close_episode(EpisodeCloseReason.CANCELLED)
        await environment.close()

    asyncio.run(cancelled_mid_step())
    # Whatever a session's end logs is logged before uvicorn lets its connection go.
    _wait_for(lambda: not server.server_state.connections, "the server to drop its connections")

    assert all(r.status == "truncated" for r in episodes) and probe.passed, probe.checks
    assert [f"{r.levelname} {r.getMessage()} {r.exc_info and r.exc_info[0].__name__}"
            for r in records.records] == []
