"""Start a vLLM server the way a remote backend needs it (``python -m workers.inference_server``).

The flags that matter to producers (workers/remote_engine.py):

- ``--logprobs-mode processed_logprobs``: a token's log-prob under the distribution it was sampled
  from, after temperature, as the built-in engine records it (measured against the trainer's own
  forward pass on SmolLM2-135M in float32: within 3e-5 at temperatures 1.0 and 0.7);
- ``--dtype float32`` by default, the trainer's on a CPU;
- the model served under the name producers ask for (``--served-model-name``), from an imported
  model directory under the operator's model roots, offline (``HF_HUB_OFFLINE``);
- ``VLLM_SERVER_DEV_MODE=1``: the routes that pause, resume and reload weights in place.

vLLM runs from the virtual environment ``make vllm`` builds (``TANDEM_VLLM_PYTHON``, default
``var/vllm-venv/bin/python``), never this one: it pins its own torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tandem.allowlists.model_paths import REPO_ROOT, check_model_path

VLLM_PYTHON_SETTING = "TANDEM_VLLM_PYTHON"
DEFAULT_VLLM_PYTHON = REPO_ROOT / "var" / "vllm-venv" / "bin" / "python"


def vllm_python() -> Path:
    return Path(os.environ.get(VLLM_PYTHON_SETTING) or DEFAULT_VLLM_PYTHON)


def server_command(*, model_dir: str, served_name: str, host: str, port: int, max_model_len: int,
                   dtype: str = "float32", extra: list[str] | None = None) -> list[str]:
    """The vLLM server's argv for ``model_dir`` (checked against the operator's model roots)."""
    model = check_model_path(model_dir)
    return [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", served_name, "--host", host, "--port", str(port), "--dtype", dtype,
            "--max-model-len", str(max_model_len), "--logprobs-mode", "processed_logprobs",
            "--generation-config", "vllm", *(extra or [])]


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
    parser.add_argument("--kv-cache-gib", type=float, default=None,
                        help="the CPU build's KV cache (VLLM_CPU_KVCACHE_SPACE); default: vLLM's")
    args, extra = parser.parse_known_args(argv)
    if not vllm_python().is_file():
        sys.exit(f"{vllm_python()} is missing: run `make vllm` (or set {VLLM_PYTHON_SETTING})")
    command = server_command(model_dir=args.model, served_name=args.served_model_name, host=args.host,
                             port=args.port, max_model_len=args.max_model_len, dtype=args.dtype, extra=extra)
    os.execve(command[0], command, server_environment(kv_cache_gib=args.kv_cache_gib))


if __name__ == "__main__":
    main()
