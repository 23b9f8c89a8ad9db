"""Runs: where their configs may point the trainer and producers for model files (tandem/allowlists/model_paths.py)."""

from tandem.allowlists.model_paths import checkpoint_root, model_roots
from tandem.configs.quotas import RunQuotas

from .env_vars import env_str

# Directories model.hf_checkpoint and model.tokenizer may lie under (TANDEM_MODEL_ROOTS,
# comma separated; default var/models), and the checkpoint root they may not reach
# (TANDEM_CHECKPOINT_ROOT, default var/checkpoints). The trainer and workers read the same variables.
TANDEM_MODEL_ROOTS = model_roots()
TANDEM_CHECKPOINT_ROOT = checkpoint_root()
# What one run may ask of the shared trainer and workers (tandem/configs/quotas.py: TANDEM_MAX_PARAMETERS,
# TANDEM_MAX_KV_CACHE_BYTES, TANDEM_MAX_EPISODES_PER_STEP, TANDEM_MAX_ACTIVE_RUNS_PER_PROJECT).
TANDEM_RUN_QUOTAS = RunQuotas.from_environment()
# How long a run's Redis keys (streams, weights, spec) outlive it: finished or cancelled runs'
# for a day, paused or failed ones (which a resume needs) for 30 days; a resume keeps them.
TANDEM_ENDED_RUN_KEYS_RETENTION_S = int(env_str("TANDEM_ENDED_RUN_KEYS_RETENTION_S", str(24 * 3600)))
TANDEM_RELEASED_RUN_KEYS_RETENTION_S = int(
    env_str("TANDEM_RELEASED_RUN_KEYS_RETENTION_S", str(30 * 24 * 3600))
)
