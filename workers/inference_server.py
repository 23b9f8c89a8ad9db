"""Start a vLLM server the way a remote backend needs it (``python -m workers.inference_server``).

The flags that matter to producers (workers/remote_engine.py):

- ``--logprobs-mode processed_logprobs``: a token's log-prob under the distribution it was sampled
  from, after temperature, as the built-in engine records it (measured against the trainer's own
  forward pass on SmolLM2-135M in float32: within 3e-5 at temperatures 1.0 and 0.7);
- ``--dtype float32`` by default, the trainer's on a CPU;
- the model served under the name producers ask for (``--served-model-name``), from an imported
  model directory under the operator's model roots, offline (``HF_HUB_OFFLINE``);
- ``VLLM_SERVER_DEV_MODE=1``: the routes that pause, resume and reload weights in place;
- a model that ties its output head to its embedding is served from an untied copy of its weights
  (``--weights-dir``; workers/remote_weights.py says why), with the imported directory's tokenizer.

vLLM runs from the virtual environment ``make vllm`` builds (``TANDEM_VLLM_PYTHON``, default
``var/vllm-venv/bin/python``), never this one: it pins its own torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tandem.allowlists.model_paths import REPO_ROOT, ModelPathRefused, check_model_path
from workers.remote_weights import untied_copy

VLLM_PYTHON_SETTING = "TANDEM_VLLM_PYTHON"
DEFAULT_VLLM_PYTHON = REPO_ROOT / "var" / "vllm-venv" / "bin" / "python"


def vllm_python() -> Path:
    return Path(os.environ.get(VLLM_PYTHON_SETTING) or DEFAULT_VLLM_PYTHON)


def server_command(*, model_dir: str, weights_dir: str | Path, served_name: str, host: str, port: int,
                   max_model_len: int, dtype: str = "float32", extra: list[str] | None = None) -> list[str]:
    """The vLLM server's argv for the imported ``model_dir`` (checked against the operator's model
    roots), its weights served from ``weights_dir`` (:func:`served_weights`)."""
    model = check_model_path(model_dir)
    weights = served_weights(model, weights_dir)
    return [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(weights),
            "--tokenizer", str(model), "--served-model-name", served_name, "--host", host, "--port", str(port),
            "--dtype", dtype, "--max-model-len", str(max_model_len), "--logprobs-mode", "processed_logprobs",
            "--generation-config", "vllm", *(extra or [])]


def served_weights(model_dir: Path, weights_dir: str | Path) -> Path:
    """``model_dir`` itself, or for a model with a tied head an untied copy of it in ``weights_dir``."""
    tied = json.loads((model_dir / "config.json").read_text()).get("tie_word_embeddings")
    return untied_copy(model_dir, weights_dir) if tied else model_dir


def server_environment(*, kv_cache_gib: float | None = None) -> dict[str, str]:
    """The server's environment: offline, with the weight-update routes; the CPU build's KV cache in GiB."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"}
    if kv_cache_gib is not None:
        environment["VLLM_CPU_KVCACHE_SPACE"] = f"{kv_cache_gib:g}"
    return environment


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an imported model's directory, under TANDEM_MODEL_ROOTS")
    parser.add_argument("--served-model-name", default="policy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--weights-dir", default=None,
                        help="where the untied copy of a tied model goes (default var/inference/<name>/version-0)")
    parser.add_argument("--kv-cache-gib", type=float, default=None,
                        help="the CPU build's KV cache (VLLM_CPU_KVCACHE_SPACE); default: vLLM's")
    args, extra = parser.parse_known_args(argv)
    if not vllm_python().is_file():
        sys.exit(f"{vllm_python()} is missing: run `make vllm` (or set {VLLM_PYTHON_SETTING})")
    weights_dir = args.weights_dir or REPO_ROOT / "var" / "inference" / args.served_model_name / "version-0"
    try:
        command = server_command(model_dir=args.model, weights_dir=weights_dir, served_name=args.served_model_name,
                                 host=args.host, port=args.port, max_model_len=args.max_model_len, dtype=args.dtype,
                                 extra=extra)
    except (ModelPathRefused, OSError, ValueError) as exc:
        sys.exit(f"--model: {exc}")
    os.execve(command[0], command, server_environment(kv_cache_gib=args.kv_cache_gib))


if __name__ == "__main__":
    main()
