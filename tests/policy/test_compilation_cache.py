"""The persistent compilation cache: a second process loads what the first one compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from policy.compilation_cache import CACHE_DIR_VARIABLE

# Compiles a small engine's buckets (each takes longer than the cache's
# threshold) and reports how many programs came from the cache.
WARM_UP_AN_ENGINE = """
import json, jax
from flax import nnx
from jax import monitoring
from policy.compilation_cache import enable_compilation_cache
from policy.engine import InferenceEngine
from policy.model import Transformer, TransformerConfig, split_model

directory = enable_compilation_cache()
hits = []
monitoring.register_event_listener(lambda event, **_: hits.append(event) if event.endswith("cache_hits") else None)
config = TransformerConfig(vocab_size=300, d_model=32, num_layers=1, num_heads=2, mlp_dim=64, max_seq_len=32)
graphdef, params = split_model(Transformer(config, rngs=nnx.Rngs(0)))
engine = InferenceEngine(graphdef, config=config, eos_id=1, pad_id=0, num_slots=2, chunk_size=4, background=False)
engine.set_params(params, version=1)
engine.warmup()
print(json.dumps({"directory": str(directory) if directory else None, "cache_hits": len(hits),
                  "configured": jax.config.jax_compilation_cache_dir}))
"""


def _warm_up_in_a_new_process(cache_setting: str) -> dict:
    env = {**os.environ, CACHE_DIR_VARIABLE: cache_setting, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", WARM_UP_AN_ENGINE], env=env, capture_output=True, text=True,
                            timeout=300, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(700)  # above its inner waits (tests/test_timeouts.py)
def test_a_second_process_loads_the_programs_the_first_one_compiled(tmp_path):
    cache = tmp_path / "jax-cache"
    first = _warm_up_in_a_new_process(str(cache))
    assert first["directory"] == str(cache) == first["configured"]
    assert first["cache_hits"] == 0
    written = list(cache.glob("*-cache"))
    assert written, "the first process wrote no compiled program"

    second = _warm_up_in_a_new_process(str(cache))
    assert second["cache_hits"] >= len(written) > 0


def test_off_leaves_the_cache_off():
    assert _warm_up_in_a_new_process("off") == {"directory": None, "cache_hits": 0, "configured": None}
