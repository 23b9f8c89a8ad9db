"""Generation on remote inference servers that speak vLLM's OpenAI-compatible API (issue 33).

Token ids in, sampled token ids and their log-probs out: a turn's prompt goes to
``/v1/completions`` as token ids, with ``return_token_ids`` and ``logprobs: 0``, so the
trajectory holds exactly what the server sampled, and the run's sampling parameters go with
every request (temperature, top-p, top-k, the seed, stop strings kept in the output, the
template's end-of-turn token). A :class:`RemoteEngine` answers as
:class:`~policy.InferenceEngine` does (``generate`` returns a
:class:`~policy.Completion`), so producers run episodes on it unchanged.

Several servers share the load: each request goes to the server with the fewest requests in
flight from this engine. A server that cannot be reached or answers a server error is taken
out of rotation for ``retry_after_s`` with its reason, and the request goes to another;
when none is left, :class:`RemoteBackendUnavailable` says why for each. A request the server
refuses (4xx: a prompt too long for it, say) raises :class:`RemoteRequestRefused`, which fails
that episode only. Redirects are never followed, and every URL is held to the environment URL
rules (``tandem.allowlists.environment_urls``) when the engine is built.

Servers are started with ``--logprobs-mode processed_logprobs``: the log-probs are then those of
the distribution after temperature, as the built-in engine's are (with top-k and top-p off,
the runs' default, the two agree).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Hashable, Sequence
from typing import Any

import aiohttp

from policy import Completion, SamplingParams
from tandem.allowlists.environment_urls import check_environment_url, resolve_host

# A turn of a long episode on a loaded CPU server can take minutes; a stuck server is seen by this.
DEFAULT_REQUEST_TIMEOUT_S = 600.0
# How long a server that failed stays out of rotation before it is tried again.
DEFAULT_RETRY_AFTER_S = 10.0


class RemoteRequestRefused(RuntimeError):
    """A server refused the request itself (a 4xx answer): another server would refuse it too."""


class RemoteBackendUnavailable(RuntimeError):
    """No server of the backend could take the request; the message names each one's reason."""


@dataclasses.dataclass
class RemoteServer:
    """One server of a backend, as this engine sees it."""

    url: str
    in_flight: int = 0
    failures: int = 0
    # time.monotonic() before which it is out of rotation, and why.
    out_until: float = 0.0
    reason: str = ""

    def available(self, now: float) -> bool:
        return now >= self.out_until


@dataclasses.dataclass(frozen=True)
class RemoteEngineStats:
    """Counters since the engine was built (a snapshot)."""

    requests: int
    generated_tokens: int
    prompt_tokens: int
    retried_requests: int
    # Seconds during which at least one request was in flight: the engine's busy time.
    busy_s: float


class RemoteEngine:
    """Turns generated on remote servers; built by the operator's backend, shared by a process's episodes."""

    def __init__(self, servers: Sequence[str], *, model: str, end_of_turn_id: int, policy_version: int = 0,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S, retry_after_s: float = DEFAULT_RETRY_AFTER_S,
                 url_allowlist: Sequence[str] | None = None):
        if not servers:
            raise ValueError("a remote backend needs at least one server")
        for url in servers:
            check_environment_url(url, allowlist=url_allowlist, resolve=resolve_host)
        self.servers = [RemoteServer(url=url.rstrip("/")) for url in servers]
        self.model = model
        self.end_of_turn_id = end_of_turn_id
        self.policy_version = policy_version
        self.request_timeout_s = request_timeout_s
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._requests = self._generated = self._prompt_tokens = self._retried = 0
        self._busy_s = 0.0
        self._busy_since: float | None = None
        self._active = 0

    @property
    def stats(self) -> RemoteEngineStats:
        with self._lock:
            busy = self._busy_s + (time.monotonic() - self._busy_since if self._busy_since is not None else 0.0)
            return RemoteEngineStats(requests=self._requests, generated_tokens=self._generated,
                                     prompt_tokens=self._prompt_tokens, retried_requests=self._retried,
                                     busy_s=busy)

    def _pick(self, tried: set[str]) -> RemoteServer | None:
        now = time.monotonic()
        with self._lock:
            candidates = [server for server in self.servers if server.url not in tried and server.available(now)]
            if not candidates:
                return None
            server = min(candidates, key=lambda server: (server.in_flight, server.failures))
            server.in_flight += 1
            return server

    def _release(self, server: RemoteServer, *, failed: str | None) -> None:
        with self._lock:
            server.in_flight -= 1
            if failed is None:
                server.failures = 0
                return
            server.failures += 1
            server.out_until = time.monotonic() + self.retry_after_s
            server.reason = failed

    def _body(self, prompt: list[int], params: SamplingParams) -> dict[str, Any]:
        return {
            "model": self.model, "prompt": list(prompt), "max_tokens": params.max_new_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "seed": params.seed & 0x7FFFFFFF, "stop": list(params.stop), "include_stop_str_in_output": True,
            "stop_token_ids": [self.end_of_turn_id], "logprobs": 0, "return_token_ids": True, "n": 1,
        }

    async def generate(self, session_id: Hashable | None, prompt: list[int], params: SamplingParams) -> Completion:
        """One turn after ``prompt`` on the least loaded server that answers.

        ``session_id`` is accepted for the built-in engine's signature; a server reuses a cached
        prefix by its own prefix cache.
        """
        body = self._body(prompt, params)
        tried: set[str] = set()
        reasons: list[str] = []
        while (server := self._pick(tried)) is not None:
            tried.add(server.url)
            self._enter()
            failed = None
            try:
                answer = await self._post(server, body)
            except (TimeoutError, aiohttp.ClientError, _ServerFault) as exc:
                failed = f"{server.url}: {_describe(exc)}"
                reasons.append(failed)
                continue
            finally:
                # Also when the turn is refused or its episode cancelled: the server's count stays true.
                self._release(server, failed=failed)
                self._leave()
            completion = self._completion(answer, server)
            with self._lock:
                self._requests += 1
                self._retried += len(tried) > 1
                self._generated += len(completion.token_ids)
                self._prompt_tokens += len(prompt)
            return completion
        now = time.monotonic()
        with self._lock:
            resting = [f"{server.url}: {server.reason} (out of rotation for {server.out_until - now:.0f} s more)"
                       for server in self.servers if server.url not in tried]
        raise RemoteBackendUnavailable("no inference server could take the turn: " + "; ".join(reasons + resting))

    async def _post(self, server: RemoteServer, body: dict[str, Any]) -> dict[str, Any]:
        # A session per turn: producers run episodes on an event loop per task thread, each closed with
        # its task, and a turn takes seconds where a loopback connection takes a fraction of a millisecond.
        async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)) as session,
                    session.post(f"{server.url}/v1/completions", json=body, allow_redirects=False) as response):
            text = await response.text()
            if response.status >= 500 or 300 <= response.status < 400:
                raise _ServerFault(f"HTTP {response.status}: {text[:300]}")
            if response.status >= 400:
                raise RemoteRequestRefused(f"{server.url} refused the turn: HTTP {response.status}: {text[:500]}")
            try:
                return await response.json(content_type=None)
            except ValueError:
                raise _ServerFault(f"HTTP {response.status} without JSON: {text[:300]}") from None

    def _completion(self, answer: dict[str, Any], server: RemoteServer) -> Completion:
        try:
            [choice] = answer["choices"]
            token_ids = [int(token) for token in choice["token_ids"]]
            logprobs = [float(value) for value in choice["logprobs"]["token_logprobs"]]
            finish_reason = choice["finish_reason"]
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteRequestRefused(f"{server.url} answered without token ids and log-probs ({_describe(exc)}): "
                                       "is it a vLLM server started with the flags of `tandem inference-server`?"
                                       ) from None
        if len(logprobs) != len(token_ids):
            raise RemoteRequestRefused(f"{server.url} answered {len(token_ids)} tokens with {len(logprobs)} log-probs")
        if finish_reason == "length":
            stop_reason = "length"
        elif finish_reason == "stop":
            # A stop string is named; the end-of-turn token (kept in token_ids) is its id or None.
            stop_reason = "stop" if isinstance(choice.get("stop_reason"), str) else "eos"
        else:
            raise RemoteRequestRefused(f"{server.url} ended the turn with finish_reason {finish_reason!r}")
        return Completion(token_ids=token_ids, logprobs=logprobs, finished=stop_reason != "length",
                          stop_reason=stop_reason, policy_version=self.policy_version,
                          last_policy_version=self.policy_version)

    def _enter(self) -> None:
        with self._lock:
            if self._active == 0:
                self._busy_since = time.monotonic()
            self._active += 1

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0 and self._busy_since is not None:
                self._busy_s += time.monotonic() - self._busy_since
                self._busy_since = None

    def end_session(self, session_id: Hashable) -> None:
        """Nothing to free: the server's prefix cache keeps what it keeps."""

    def warmup(self) -> bool:
        """Nothing to compile here: the server warmed up when it started."""
        return False

    def server_states(self) -> list[dict[str, Any]]:
        """Each server's URL, requests in flight, and whether and why it is out of rotation."""
        now = time.monotonic()
        with self._lock:
            return [{"url": server.url, "in_flight": server.in_flight, "available": server.available(now),
                     "reason": "" if server.available(now) else server.reason} for server in self.servers]

    def close(self) -> None:
        """Nothing held between turns: each turn's connection closed with it."""


class _ServerFault(Exception):
    """The server failed (5xx) or answered with a redirect, which is never followed."""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
