"""Telemetry: how much of a run's recent detail the platform keeps."""

from .env_vars import env_str

# Trainer steps per run whose stages and episodes the timeline page can show; older
# steps' detail is deleted (their metric series stay). About 350 bytes per episode (its
# JSON): 2000 steps of 64 episodes take some 45 MB of a run's rows.
TANDEM_TIMELINE_STEPS_KEPT = int(env_str("TANDEM_TIMELINE_STEPS_KEPT", "2000"))
