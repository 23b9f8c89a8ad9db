"""The OpenAI-compatible endpoint an agent program's episode calls, and the trajectory built from its calls.

One HTTP server per producer process, on its episode loop, serves every agent episode of the process.
Each episode gets its own base URL (``http://<host>:<port>/episodes/<episode_id>/v1``) and key
(``Authorization: Bearer <key>``), valid while the episode runs and refused after it ends. Routes:

- ``GET /models``: the one model, the run's policy;
- ``POST /chat/completions``: ``messages`` (system, developer, user, assistant and tool roles), ``tools``,
  ``tool_choice``, ``max_tokens`` or ``max_completion_tokens``, ``stop``, ``temperature``, ``top_p``,
  ``n=1`` and ``stream``; the answer's ``tool_calls`` are parsed from the model's own format;
- ``POST /reward``: ``{"reward": float}``, the episode's reward.

The run's sampling settings win: a request that asks another temperature, top-p or token limit is
answered with the run's, and the override is recorded on the call (:class:`~tandem.contracts.AgentCall`).

Token in, token out. The endpoint renders a request's messages into tokens itself, turn by turn, with
the policy's prompt layout (policy/prompt_format.py), and keeps them: when a request's messages extend
the previous request's messages and the answer given (compared message by message: role, text, and
the calls' names and arguments), only the new messages are rendered and appended after the tokens
already there, the answer's exactly as sampled. Such calls form one *chain*, one sequence the trainer
trains: the sampled tokens with their log-probs, everything else masked. A request that does not
extend the chain (the agent dropped, edited or summarised messages, or changed its tools) begins a new
chain: the whole conversation rendered again, earlier answers by their sampled tokens where the agent
gave them back unchanged, all masked. The record holds each chain as a segment of its own, trained on
its own context and sharing the episode's reward (SkyRL's step-wise fallback).

Only clients in ``TANDEM_AGENT_ENDPOINT_CLIENTS`` (networks, comma separated; default loopback) reach
the server, which listens on ``TANDEM_AGENT_ENDPOINT_HOST`` (default 127.0.0.1) and port
``TANDEM_AGENT_ENDPOINT_PORT`` (default: any free one), and tells agents to call
``TANDEM_AGENT_ENDPOINT_ADVERTISED_HOST`` (default: the listening host).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import os
import secrets
import time
import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from environments import (
    AgentEndpointAccess,
    Tool,
    ToolError,
    format_tool_call,
    parse_tool_calls,
    text_outside_calls,
)
from policy import (
    ChatTemplateError,
    Completion,
    EpisodeTokens,
    PromptFormatError,
    PromptLayout,
    Tokenizer,
    tool_call_parse_formats,
)
from tandem.configs.rollout import SamplingConfig
from tandem.contracts import AgentCall, MessageToolCall

logger = logging.getLogger(__name__)

HOST_SETTING = "TANDEM_AGENT_ENDPOINT_HOST"
PORT_SETTING = "TANDEM_AGENT_ENDPOINT_PORT"
ADVERTISED_HOST_SETTING = "TANDEM_AGENT_ENDPOINT_ADVERTISED_HOST"
CLIENTS_SETTING = "TANDEM_AGENT_ENDPOINT_CLIENTS"
_DEFAULT_CLIENTS = "127.0.0.0/8,::1/128"
# A request body larger than this is refused: an agent's conversation is bounded by max_seq_len.
_MAX_REQUEST_BYTES = 8 * 1024 * 1024


class SamplingPolicy(Protocol):
    """What the endpoint needs of a policy: the run's sampling settings, turns, and sessions."""

    sampling: SamplingConfig

    async def generate(self, prompt: list[int], *, session_id: Hashable | None = None,
                       extra_stop: Sequence[str] = ()) -> Completion: ...

    def end_session(self, session_id: Hashable) -> None: ...


# -- the request, as OpenAI's API defines it (the fields the endpoint reads; others are ignored) --------

class _FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str | dict = "{}"


class _ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    type: Literal["function"] = "function"
    function: _FunctionCall


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_ToolCallIn] | None = None
    tool_call_id: str | None = None


class _FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    parameters: dict = Field(default_factory=lambda: {"type": "object", "properties": {}})


class _ToolSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: _FunctionSpec


class ChatCompletionRequest(BaseModel):
    """The part of OpenAI's chat completion request the endpoint serves."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[_Message] = Field(min_length=1)
    tools: list[_ToolSpec] | None = None
    tool_choice: str | dict | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: dict | None = None


class EndpointError(Exception):
    """A request the endpoint refuses, answered in OpenAI's error format."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


# -- messages as the endpoint compares them --------------------------------------------------------

@dataclass(frozen=True)
class _Said:
    """One message, as compared to find where a conversation extends a chain."""

    role: str
    content: str
    calls: tuple[tuple[str, str], ...] = ()  # (name, canonical JSON arguments)

    def tool_calls(self) -> list[dict[str, Any]]:
        return [{"name": name, "arguments": json.loads(arguments)} for name, arguments in self.calls]

    def for_layout(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content}


def _canonical(arguments: Any) -> str:
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for index, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise EndpointError(400, f"only text content parts are served, not {part.get('type')!r}",
                                param=f"{where}.content[{index}]")
        texts.append(part["text"])
    return "".join(texts)


def _said(message: _Message, index: int) -> _Said:
    where = f"messages[{index}]"
    role = "system" if message.role == "developer" else message.role
    calls = []
    for call_index, call in enumerate(message.tool_calls or ()):
        arguments = call.function.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise EndpointError(400, "the call's arguments are not JSON",
                                    param=f"{where}.tool_calls[{call_index}].function.arguments") from None
        if not isinstance(arguments, dict):
            raise EndpointError(400, "the call's arguments are not a JSON object",
                                param=f"{where}.tool_calls[{call_index}].function.arguments")
        calls.append((call.function.name, _canonical(arguments)))
    if calls and role != "assistant":
        raise EndpointError(400, "only assistant messages make tool calls", param=f"{where}.tool_calls")
    return _Said(role, _text(message.content, where), tuple(calls))


async def _never_run(arguments: dict[str, Any]) -> str:
    raise ToolError("an agent's tools run in the agent, not in Tandem")


def _tools(specs: list[_ToolSpec] | None) -> tuple[Tool, ...]:
    tools = []
    for spec in specs or ():
        parameters = spec.function.parameters
        tools.append(Tool(spec.function.name, spec.function.description, parameters, _never_run))
    if len({tool.name for tool in tools}) != len(tools):
        raise EndpointError(400, "two tools have the same name", param="tools")
    return tuple(tools)


def _tools_key(tools: Sequence[Tool]) -> tuple:
    return tuple((tool.name, tool.description, _canonical(tool.parameters)) for tool in tools)


@dataclass
class _Chain:
    """One prefix-consistent sequence of calls: its tokens, the messages they hold, its engine session."""

    tokens: EpisodeTokens
    said: list[_Said]
    tools_key: tuple
    session_id: str


@dataclass
class AgentEpisodeResult:
    """What an agent episode's calls add up to, for its trajectory record."""

    tokens: EpisodeTokens
    calls: tuple[AgentCall, ...]
    policy_versions: list[int]
    newest_policy_version: int | None
    generation_s: float
    reward: float | None
    # Why the endpoint refused a call for lack of room (max_seq_len, max_turns); None if it never did.
    truncated_because: str | None
    history_rewrites: int
    endpoint_failure: str | None = None


@dataclass
class AgentEpisode:
    """The endpoint's side of one agent episode: its key, its chains and calls, its reward."""

    policy: SamplingPolicy
    layout: PromptLayout
    tokenizer: Tokenizer
    max_seq_len: int
    max_calls: int
    model: str
    episode_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    reward: float | None = None
    ended: bool = False
    # The first error of Tandem's own in serving a call: the episode fails with it, whatever the agent did.
    endpoint_failure: str | None = None
    _chains: list[_Chain] = field(default_factory=list)
    _calls: list[AgentCall] = field(default_factory=list)
    # An earlier answer's exact tokens, by how it reads: a rewritten history that gives it back unchanged
    # gets its sampled tokens again, not a rendering of its text.
    _answers: dict[_Said, list[int]] = field(default_factory=dict)
    _policy_versions: list[int] = field(default_factory=list)
    _newest_version: int | None = None
    _generation_s: float = 0.0
    _truncated_because: str | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def accepts(self, key: str) -> bool:
        return not self.ended and hmac.compare_digest(key.encode(), self.key.encode())

    def set_reward(self, reward: Any) -> None:
        if isinstance(reward, bool) or not isinstance(reward, int | float) or reward != reward \
                or reward in (float("inf"), float("-inf")):
            raise EndpointError(400, f"reward is {reward!r}, expected a finite number", param="reward")
        self.reward = float(reward)

    async def complete(self, request: ChatCompletionRequest) -> dict[str, Any]:
        """Answer one chat completion request; the call is recorded, its tokens kept."""
        async with self._lock:
            if self.ended:
                raise EndpointError(401, "the episode has ended", code="invalid_api_key")
            began = time.perf_counter()
            if len(self._calls) >= self.max_calls:
                self._truncated_because = f"the agent's call {len(self._calls) + 1} passed max_turns={self.max_calls}"
                raise EndpointError(400, f"this episode allows {self.max_calls} calls (the run's max_turns)",
                                    code="max_turns_exceeded")
            said = [_said(message, index) for index, message in enumerate(request.messages)]
            if said[-1].role == "assistant":
                raise EndpointError(400, "the last message is the assistant's: nothing to answer",
                                    param=f"messages[{len(said) - 1}]")
            tools = _tools(request.tools)
            stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or ())
            if any(not text for text in stop):
                raise EndpointError(400, "a stop string is empty", param="stop")
            overrides = _overrides(request, self.policy.sampling)
            # Last of the checks: it appends the request's new messages to a chain (refused, it appends none).
            chain = self._chain_for(said, tools)
            prompt_tokens = len(chain.tokens.context())
            generated = time.perf_counter()
            try:
                completion = await self.policy.generate(chain.tokens.context(), session_id=chain.session_id,
                                                        extra_stop=stop)
            except Exception as exc:  # noqa: BLE001 - the agent is told; the episode records it
                logger.warning("agent episode %s: generation failed", self.episode_id, exc_info=True)
                self.endpoint_failure = self.endpoint_failure or f"generation failed: {type(exc).__name__}: {exc}"
                raise EndpointError(500, f"generation failed: {type(exc).__name__}") from exc
            self._generation_s += time.perf_counter() - generated
            self._policy_versions.append(completion.policy_version)
            self._newest_version = completion.last_policy_version
            text = self.tokenizer.decode(completion.token_ids)
            parsed = parse_tool_calls(text, tools, formats=tool_call_parse_formats(self.layout))
            calls = [(call.tool.name, call.arguments) for call in parsed.calls]
            self.layout.add_sampled(chain.tokens, completion.token_ids, completion.logprobs, content=text,
                                    tool_calls=[{"name": name, "arguments": arguments} for name, arguments in calls])
            chain.tokens.note_tool_call_outcome(parsed.status, parsed.error)
            content = text_outside_calls(text, parsed)
            answer = _Said("assistant", content, tuple((name, _canonical(arguments)) for name, arguments in calls))
            chain.said = [*said, answer]
            self._answers[answer] = list(completion.token_ids)
            finish = "tool_calls" if calls else ("stop" if completion.finished else "length")
            self._calls.append(AgentCall(
                chain=len(self._chains) - 1, prompt_tokens=prompt_tokens,
                completion_tokens=len(completion.token_ids), latency_s=time.perf_counter() - began,
                content=text, tool_calls=tuple(MessageToolCall(name=name, arguments=arguments)
                                               for name, arguments in calls),
                finish_reason=finish, overrides=tuple(overrides), streamed=request.stream))
            return {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [{
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": content if content or not calls else None,
                        **({"tool_calls": [
                            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                             "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
                            for name, arguments in calls]} if calls else {}),
                    },
                    "finish_reason": finish,
                    "logprobs": None,
                }],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(completion.token_ids),
                          "total_tokens": prompt_tokens + len(completion.token_ids)},
            }

    def _tokens_elsewhere(self, chain: _Chain | None) -> int:
        return sum(len(other.tokens) for other in self._chains if other is not chain)

    def _record_budget(self) -> int:
        """Tokens the record may hold before a call: max_seq_len less the longest answer."""
        return self.max_seq_len - self.policy.sampling.max_new_tokens - self.layout.turn_overhead

    def _chain_for(self, said: list[_Said], tools: tuple[Tool, ...]) -> _Chain:
        """The chain ``said`` extends, with its new messages appended; else a new chain of it. Refused for
        lack of room (the record's chains, these messages and the longest answer past max_seq_len), it
        changes nothing, so that the agent may retry, or send a shorter history."""
        tools_key = _tools_key(tools)
        last = self._chains[-1] if self._chains else None
        if last is not None and last.tools_key == tools_key and len(said) > len(last.said) \
                and said[:len(last.said)] == last.said:
            new = said[len(last.said):]
            if all(message.role != "assistant" for message in new):
                room = self._record_budget() - self._tokens_elsewhere(last)
                if not self._render(lambda: self.layout.add_messages(
                        last.tokens, [message.for_layout() for message in new], max_tokens=room)):
                    self._too_long()
                return last
        tokens = self._render(lambda: self._start(said, tools))
        if self._tokens_elsewhere(None) + len(tokens) > self._record_budget():
            self._too_long()
        if last is not None:
            self.policy.end_session(last.session_id)
        chain = _Chain(tokens, [], tools_key, session_id=f"{self.episode_id}:{len(self._chains)}")
        self._chains.append(chain)
        return chain

    def _too_long(self) -> None:
        sampling = self.policy.sampling
        self._truncated_because = (
            f"the agent's call {len(self._calls) + 1} leaves no room for an answer: its messages, the episode's "
            f"other chains and max_new_tokens={sampling.max_new_tokens} pass max_seq_len={self.max_seq_len}")
        raise EndpointError(400, f"the conversation leaves no room for an answer within the run's max_seq_len="
                            f"{self.max_seq_len} (max_new_tokens={sampling.max_new_tokens})",
                            code="context_length_exceeded")

    @staticmethod
    def _render(render):
        try:
            return render()
        except (PromptFormatError, ChatTemplateError) as exc:
            raise EndpointError(400, f"the messages cannot be rendered in the model's chat template: {exc}",
                                param="messages") from None

    def _start(self, said: list[_Said], tools: tuple[Tool, ...]) -> EpisodeTokens:
        """The tokens of a whole conversation: its system and first user messages as the opening, then
        each message in turn, earlier answers by their sampled tokens where they are unchanged."""
        at = 0
        systems = []
        while at < len(said) and said[at].role == "system":
            systems.append(said[at].content)
            at += 1
        if at == len(said) or said[at].role != "user":
            raise EndpointError(400, "the conversation must begin with system messages, then a user message",
                                param=f"messages[{at}]")
        # Everything before the first answer is the opening prompt: a layout opens with one user message.
        opening = []
        while at < len(said) and said[at].role != "assistant":
            opening.append(said[at].content)
            at += 1
        tokens = self.layout.start("\n\n".join(opening), tools, system="\n\n".join(systems) or None)
        while at < len(said):
            if said[at].role == "assistant":
                answer = said[at]
                token_ids = self._answers.get(answer)
                if token_ids is None:
                    token_ids = self.tokenizer.encode(self._native_text(answer))
                self.layout.add_replayed(tokens, token_ids, content=self.tokenizer.decode(token_ids),
                                         tool_calls=answer.tool_calls())
                at += 1
                continue
            run = []
            while at < len(said) and said[at].role != "assistant":
                run.append(said[at].for_layout())
                at += 1
            self.layout.add_messages(tokens, run)
        return tokens

    def _native_text(self, answer: _Said) -> str:
        """An answer the policy never gave, written as the policy writes its own."""
        calls = [format_tool_call(name, arguments, self.layout.tool_call_format)
                 for name, arguments in ((call["name"], call["arguments"]) for call in answer.tool_calls())]
        return "\n".join(part for part in (answer.content, *calls) if part)

    def finish(self) -> AgentEpisodeResult:
        """End the episode (its key is refused from now on) and gather its chains into one record's tokens."""
        self.ended = True
        for chain in self._chains:
            self.policy.end_session(chain.session_id)
        combined = EpisodeTokens(tools=self._chains[0].tokens.tools if self._chains else ())
        combined.segment_starts = []
        for chain in self._chains:
            offset = len(combined)
            combined.segment_starts += [offset + start for start in chain.tokens.segment_starts]
            combined.token_ids += chain.tokens.token_ids
            combined.loss_mask += chain.tokens.loss_mask
            combined.behaviour_logprobs += chain.tokens.behaviour_logprobs
            combined.messages += [{**message, "start": message["start"] + offset, "end": message["end"] + offset}
                                  for message in chain.tokens.messages]
        combined.segment_starts = combined.segment_starts or [0]
        return AgentEpisodeResult(
            tokens=combined, calls=tuple(self._calls), policy_versions=list(self._policy_versions),
            newest_policy_version=self._newest_version, generation_s=self._generation_s, reward=self.reward,
            truncated_because=self._truncated_because, history_rewrites=max(len(self._chains) - 1, 0),
            endpoint_failure=self.endpoint_failure)


def _overrides(request: ChatCompletionRequest, sampling: SamplingConfig) -> list[str]:
    """What ``request`` asked that the run's sampling settings overrode, as ``field: asked -> used``."""
    overrides = []
    if request.temperature is not None and request.temperature != sampling.temperature:
        overrides.append(f"temperature: {request.temperature:g} -> {sampling.temperature:g}")
    if request.top_p is not None and request.top_p != sampling.top_p:
        overrides.append(f"top_p: {request.top_p:g} -> {sampling.top_p:g}")
    for name in ("max_tokens", "max_completion_tokens"):
        asked = getattr(request, name)
        if asked is not None and asked != sampling.max_new_tokens:
            overrides.append(f"{name}: {asked} -> {sampling.max_new_tokens}")
    choice = request.tool_choice
    if choice is not None and choice != "auto":
        asked = choice if isinstance(choice, str) else json.dumps(choice, sort_keys=True)
        overrides.append(f"tool_choice: {asked} -> auto (the policy samples freely)")
    return overrides


# -- the server ------------------------------------------------------------------------------------

def _client_networks(configured: str | None = None) -> list:
    configured = os.environ.get(CLIENTS_SETTING, _DEFAULT_CLIENTS) if configured is None else configured
    networks = []
    for entry in configured.split(","):
        if entry.strip():
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                raise ValueError(f"{CLIENTS_SETTING}: {entry.strip()!r} is not a network or address") from None
    return networks


def _stream_chunks(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """A complete answer as the chunks of OpenAI's streaming format: the role, the content, each call,
    the finish reason."""
    choice = reply["choices"][0]
    message = choice["message"]
    base = {"id": reply["id"], "object": "chat.completion.chunk", "created": reply["created"], "model": reply["model"]}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        chunks.append(chunk({"content": message["content"]}))
    for index, call in enumerate(message.get("tool_calls", ())):
        chunks.append(chunk({"tool_calls": [{"index": index, **call}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    return chunks


_EPISODE = web.RequestKey("episode", AgentEpisode)


class AgentEndpointServer:
    """The process's endpoint: episodes register here, and their agents' requests are routed to them."""

    def __init__(self, *, host: str | None = None, port: int | None = None, advertised_host: str | None = None,
                 clients: str | None = None):
        self.host = host or os.environ.get(HOST_SETTING, "127.0.0.1")
        self.port = int(os.environ.get(PORT_SETTING, "0")) if port is None else port
        self.advertised_host = advertised_host or os.environ.get(ADVERTISED_HOST_SETTING) or self.host
        self._clients = _client_networks(clients)
        self._episodes: dict[str, AgentEpisode] = {}
        self._runner: web.AppRunner | None = None
        self._started = asyncio.Lock()

    async def start(self) -> None:
        async with self._started:
            if self._runner is not None:
                return
            app = web.Application(client_max_size=_MAX_REQUEST_BYTES, middlewares=[self._guard])
            app.router.add_get("/episodes/{episode_id}/v1/models", self._models)
            app.router.add_post("/episodes/{episode_id}/v1/chat/completions", self._chat_completions)
            app.router.add_post("/episodes/{episode_id}/v1/reward", self._reward)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
            self.port = runner.addresses[0][1]
            self._runner = runner
            logger.info("agent endpoint listening on %s:%d", self.host, self.port)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open(self, episode: AgentEpisode) -> AgentEndpointAccess:
        """Register ``episode``; what its agent is given to reach it."""
        self._episodes[episode.episode_id] = episode
        host = f"[{self.advertised_host}]" if ":" in self.advertised_host else self.advertised_host
        return AgentEndpointAccess(episode_id=episode.episode_id, api_key=episode.key, model=episode.model,
                                   base_url=f"http://{host}:{self.port}/episodes/{episode.episode_id}/v1")

    def close_episode(self, episode: AgentEpisode) -> AgentEpisodeResult:
        """Unregister ``episode``: its key is refused from now on. Its result."""
        self._episodes.pop(episode.episode_id, None)
        return episode.finish()

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        try:
            remote = ipaddress.ip_address((request.remote or "").split("%")[0])
        except ValueError:
            remote = None
        if remote is None or not any(remote in network for network in self._clients):
            return _error(EndpointError(403, f"this client is not in {CLIENTS_SETTING}", code="forbidden"))
        episode = self._episodes.get(request.match_info.get("episode_id", ""))
        offered = request.headers.get("Authorization", "")
        key = offered[len("Bearer "):] if offered.startswith("Bearer ") else ""
        if episode is None or not episode.accepts(key):
            return _error(EndpointError(401, "no episode of this URL accepts this key (it may have ended)",
                                        code="invalid_api_key"))
        request[_EPISODE] = episode
        try:
            return await handler(request)
        except EndpointError as exc:
            return _error(exc)
        except Exception as exc:  # noqa: BLE001 - Tandem's fault, not the agent's: recorded on its episode
            logger.exception("agent episode %s: the endpoint failed", episode.episode_id)
            episode.endpoint_failure = episode.endpoint_failure or f"{type(exc).__name__}: {exc}"
            return _error(EndpointError(500, f"the endpoint failed: {type(exc).__name__}", code="server_error"))

    async def _models(self, request: web.Request) -> web.Response:
        episode = request[_EPISODE]
        return web.json_response({"object": "list", "data": [
            {"id": episode.model, "object": "model", "created": 0, "owned_by": "tandem"}]})

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        episode = request[_EPISODE]
        try:
            body = await request.json()
            parsed = ChatCompletionRequest.model_validate(body)
        except ValueError as exc:
            raise _invalid(exc) from None
        reply = await episode.complete(parsed)
        if not parsed.stream:
            return web.json_response(reply)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for chunk in _stream_chunks(reply):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if (parsed.stream_options or {}).get("include_usage"):
            usage = {"id": reply["id"], "object": "chat.completion.chunk", "created": reply["created"],
                     "model": reply["model"], "choices": [], "usage": reply["usage"]}
            await response.write(f"data: {json.dumps(usage)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _reward(self, request: web.Request) -> web.Response:
        episode = request[_EPISODE]
        try:
            body = await request.json()
        except ValueError:
            raise EndpointError(400, "the body is not JSON") from None
        if not isinstance(body, dict) or "reward" not in body:
            raise EndpointError(400, "the body needs a `reward`", param="reward")
        episode.set_reward(body["reward"])
        return web.json_response({"reward": episode.reward})


def _invalid(exc: ValueError) -> EndpointError:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]).lstrip(".")
        return EndpointError(400, f"{where}: {first['msg']}", param=where or None)
    return EndpointError(400, "the body is not JSON")


def _error(exc: EndpointError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


_servers: dict[asyncio.AbstractEventLoop, AgentEndpointServer] = {}


async def agent_endpoint_server() -> AgentEndpointServer:
    """The endpoint of the running event loop (a producer's episode loop), started on first use."""
    loop = asyncio.get_running_loop()
    for other in [other for other in _servers if other.is_closed()]:
        del _servers[other]
    server = _servers.get(loop)
    if server is None:
        server = _servers[loop] = AgentEndpointServer()
    await server.start()
    return server
