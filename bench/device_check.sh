#!/usr/bin/env bash
# The trainer's jitted GRPO update and the inference engine on an accelerator, in one go of
# under 10 minutes: step time, tokens/s, MFU and device memory for the nano and small models
# and for SmolLM2-135M's architecture (random weights: the imported model is 500 MB and need not
# travel), in float32 and bfloat16, then SmolLM2's and Gemma 3 270M's in bfloat16; then the engine's generated tokens/s at 1, 8 and 64
# sessions on SmolLM2's and Gemma 3 270M's architectures. Each part writes its JSON line to OUT_DIR/<part>.json (and its
# log to <part>.err) as it ends, so a part that runs out of time leaves the others' figures.
#
# Usage: bash bench/device_check.sh [OUT_DIR]   (default: $OUT, else var/device-check)
# PYTHON picks the interpreter (default python3); PART_TIMEOUT_S bounds each part (default 150);
# PARTS, a comma-separated list of part names, runs only those (a device lent for minutes at a time).
# A machine without pydantic takes it from wheels in .whl/ (bench/README.md says how to fetch them).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-var/device-check}}
mkdir -p "$out"
python=${PYTHON:-python3}
if ! "$python" -c "import pydantic" 2>/dev/null && [ -d .whl ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/tandem-site .whl/*.whl \
    && export PYTHONPATH=/tmp/tandem-site${PYTHONPATH:+:$PYTHONPATH}
fi
# The allocator's peak is what the step needs, not a preallocated share of the device.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/device.txt"

part() {
  local name=$1
  shift
  if [ -n "${PARTS:-}" ] && [[ ",$PARTS," != *",$name,"* ]]; then
    return
  fi
  local began=$SECONDS
  timeout "${PART_TIMEOUT_S:-150}" "$python" "$@" > "$out/$name.json" 2> "$out/$name.err"
  echo "$name: exit $? after $((SECONDS - began)) s"
  cat "$out/$name.json"
}

part train_nano_small bench/train_step.py --steps 10 --batch-size 32
part train_smollm2_f32 bench/train_step.py --sizes smollm2-135m --steps 5 --batch-size 16 --seq-len 1024
part train_smollm2_bf16 bench/train_step.py --sizes smollm2-135m --steps 5 --batch-size 16 --seq-len 1024 \
  --param-dtype bfloat16
# Both real families' shapes in one process, the update as the trainer runs it (chunked logits).
part train_models_bf16 bench/train_step.py --sizes smollm2-135m,gemma3-270m --steps 5 --batch-size 8 --seq-len 1024 \
  --param-dtype bfloat16
# The workload's sessions stay under 128 tokens: one prefill bucket of 128 (and max_seq_len, always one)
# instead of the engine's seven, so that the warm-up's compilations fit the part's time.
part engine_smollm2_bf16 bench/sampler.py --size smollm2-135m --param-dtype bfloat16 --episodes-scale 0.25 \
  --prefill-buckets 128
part engine_gemma3_bf16 bench/sampler.py --size gemma3-270m --param-dtype bfloat16 --episodes-scale 0.25 \
  --prefill-buckets 128
