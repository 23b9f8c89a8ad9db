"""A policy version onto a remote inference server, without restarting it (issue 33).

The version is written as a Hugging Face checkpoint (``policy.export_hf_checkpoint``: config.json and
safetensors) to a directory the server can read, then loaded in place: the server pauses generation
(``/pause?mode=wait``: turns in flight finish on the weights they started with, new ones wait),
reloads its weights from the directory (``/collective_rpc`` ``reload_weights``), records the version
(``/update_weight_version``, read back by ``/weight_info``) and resumes, whatever failed between.
The routes need ``VLLM_SERVER_DEV_MODE=1``, which ``python -m workers.inference_server`` sets.

A model whose output head is its embedding (SmolLM2's ``tie_word_embeddings``) is served untied:
vLLM 0.32's in-place reload loads the embedding but not a tied head ("ParallelLMHead: Failed to
load weights"), which then keeps the weights the server started with. So every checkpoint written
for a server holds ``lm_head.weight`` and says ``tie_word_embeddings: false``
(:func:`untie_head`), and the server starts from such a copy of the imported model.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import aiohttp
from flax import nnx
from safetensors.numpy import load_file, save_file

from policy import Transformer, export_hf_checkpoint

# Reloading SmolLM2-135M from local safetensors takes seconds on a CPU; a server stuck in it is seen by this.
DEFAULT_RELOAD_TIMEOUT_S = 600.0


class RemoteWeightUpdateFailed(RuntimeError):
    """A server did not take the version; the message names the server and what it answered."""


def write_version(graphdef: nnx.GraphDef, params: nnx.State, directory: str | Path) -> Path:
    """The policy ``graphdef`` with ``params`` as a Hugging Face checkpoint in ``directory``; returns it."""
    model = nnx.merge(graphdef, params)
    if not isinstance(model, Transformer):
        raise TypeError(f"only a plain Transformer can be written for a server, not a {type(model).__name__}")
    export_hf_checkpoint(model, directory, untie_head=True)
    return Path(directory)


#: The tensor names of a Hugging Face causal LM's embedding and output head.
EMBEDDING_TENSOR = "model.embed_tokens.weight"
HEAD_TENSOR = "lm_head.weight"


def untie_head(directory: str | Path) -> bool:
    """Give the checkpoint in ``directory`` an output head of its own if it ties it to the embedding
    (a copy of it, ``tie_word_embeddings: false``); returns whether it did."""
    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    if not config.get("tie_word_embeddings"):
        return False
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else None
    file_name = index["weight_map"][EMBEDDING_TENSOR] if index else "model.safetensors"
    tensors = load_file(directory / file_name)
    tensors[HEAD_TENSOR] = tensors[EMBEDDING_TENSOR].copy()
    save_file(tensors, str(directory / file_name), metadata={"format": "pt"})
    if index:
        index["weight_map"][HEAD_TENSOR] = file_name
        index_path.write_text(json.dumps(index, indent=2) + "\n")
    config["tie_word_embeddings"] = False
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return True


def untied_copy(model_dir: str | Path, directory: str | Path) -> Path:
    """The imported model in ``model_dir`` as a server starts from it: config and weights copied to
    ``directory`` with an untied head (:func:`untie_head`), read-only files of the import left alone."""
    source, target = Path(model_dir), Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.name == "config.json" or path.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copyfile(path, target / path.name)
    untie_head(target)
    return target


async def load_version(url: str, *, directory: str | Path, version: int,
                       timeout_s: float = DEFAULT_RELOAD_TIMEOUT_S) -> float:
    """Load the checkpoint in ``directory`` into the server at ``url`` as ``version``; returns the seconds
    generation was paused. Raises RemoteWeightUpdateFailed with the server's answer."""
    url = url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await _post(session, f"{url}/pause", params={"mode": "wait"}, what="pause")
        paused_at = time.perf_counter()
        try:
            await _post(session, f"{url}/collective_rpc", what="reload its weights",
                        json={"method": "reload_weights", "kwargs": {"weights_path": str(directory)}})
            await _post(session, f"{url}/update_weight_version", json={"new_version": str(version)},
                        what="record the version")
        finally:
            await _post(session, f"{url}/resume", what="resume")
        return time.perf_counter() - paused_at


async def server_version(url: str) -> int | None:
    """The version the server at ``url`` says it holds (None: the weights it started with)."""
    async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
                session.get(f"{url.rstrip('/')}/weight_info", allow_redirects=False) as response):
        if response.status != 200:
            raise RemoteWeightUpdateFailed(f"{url}/weight_info answered HTTP {response.status}")
        version = (await response.json(content_type=None)).get("weight_version")
        return None if version in (None, "") else int(version)


async def _post(session: aiohttp.ClientSession, url: str, *, what: str, **request) -> None:
    try:
        async with session.post(url, allow_redirects=False, **request) as response:
            if response.status != 200:
                raise RemoteWeightUpdateFailed(f"{url} did not {what}: HTTP {response.status}: "
                                               f"{(await response.text())[:500]}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise RemoteWeightUpdateFailed(f"{url} did not {what}: {type(exc).__name__}: {exc}") from None
